#include "criu/streamer.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>

#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "util/fault.h"
#include "util/fd_passing.h"
#include "util/no_sigpipe.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

namespace gpuckpt::criu {

namespace {

// CRIU's own limit on one request (a file name; PATH_MAX-sized in practice).
constexpr std::uint32_t kMaxMessage = 64u << 10;

sockaddr_un socket_address(const fs::path& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof sa.sun_path)
    throw Error(Errc::kInvalidInput,
                "the streamer socket path " + path.string() + " is too long for a unix socket");
  std::memcpy(sa.sun_path, path.c_str(), path.native().size());
  return sa;
}

UniqueFd listen_on(const fs::path& path) {
  const sockaddr_un sa = socket_address(path);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(Errc::kInternal, "socket");
  ::unlink(path.c_str());  // a stale socket from a crashed run in a reused directory
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0)
    throw_errno(Errc::kIo, "bind ", path);
  // Only CRIU (root, like us) may hand us images or ask for them.
  if (::chmod(path.c_str(), 0600) != 0) throw_errno(Errc::kIo, "chmod ", path);
  if (::listen(fd.get(), 1) != 0) throw_errno(Errc::kIo, "listen ", path);
  return fd;
}

// Reads exactly `n` bytes; false at a clean end of file before the first byte.
bool read_exact(int fd, void* buf, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, static_cast<char*>(buf) + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno(Errc::kCriu, "read from criu's streamer socket");
    if (r == 0) {
      if (got == 0) return false;
      throw Error(Errc::kCriu, "criu closed the streamer socket in the middle of a message");
    }
    got += static_cast<std::size_t>(r);
  }
  return true;
}

void write_all(int fd, const void* buf, std::size_t n) {
  NoSigpipe nosig;  // criu may be gone: an error, not a signal
  if (const int err = write_fully(fd, buf, n))
    throw_syserr(Errc::kCriu, err, "write to criu's streamer socket");
}

std::uint64_t read_varint(const std::string& b, std::size_t& i) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (i >= b.size()) throw Error(Errc::kCriu, "truncated protobuf from criu");
    const auto byte = static_cast<unsigned char>(b[i++]);
    v |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return v;
  }
  throw Error(Errc::kCriu, "malformed protobuf varint from criu");
}

// img_streamer_request_entry { required string filename = 1; }
std::string parse_request(const std::string& msg) {
  std::optional<std::string> name;
  for (std::size_t i = 0; i < msg.size();) {
    const std::uint64_t key = read_varint(msg, i);
    const unsigned wire = key & 7;
    if (wire == 0) {
      read_varint(msg, i);
    } else if (wire == 2) {
      const std::uint64_t len = read_varint(msg, i);
      if (len > msg.size() - i) throw Error(Errc::kCriu, "truncated protobuf from criu");
      if ((key >> 3) == 1) name = msg.substr(i, len);
      i += len;
    } else if (wire == 1 || wire == 5) {
      i += wire == 1 ? 8 : 4;
    } else {
      throw Error(Errc::kCriu, "unexpected protobuf wire type from criu");
    }
  }
  if (!name) throw Error(Errc::kCriu, "criu sent a streamer request without a file name");
  return *name;
}

// One request: nullopt when criu closed the socket (it has opened its last image).
std::optional<std::string> read_request(int conn) {
  std::uint32_t len = 0;
  if (!read_exact(conn, &len, sizeof len)) return std::nullopt;
  if (len > kMaxMessage)
    throw Error(Errc::kCriu, "criu sent a streamer request of " + std::to_string(len) + " bytes");
  std::string msg(len, '\0');
  if (len > 0 && !read_exact(conn, msg.data(), len))
    throw Error(Errc::kCriu, "criu closed the streamer socket in the middle of a message");
  return parse_request(msg);
}

// img_streamer_reply_entry { required bool exists = 1; }
void send_reply(int conn, bool exists) {
  const unsigned char msg[] = {2, 0, 0, 0, 0x08, static_cast<unsigned char>(exists ? 1 : 0)};
  write_all(conn, msg, sizeof msg);
}

// The pipe end criu passes after a request: one dummy byte carrying it as SCM_RIGHTS.
UniqueFd recv_pipe(int conn) {
  char byte = 0;
  std::vector<UniqueFd> fds;
  bool truncated = false;
  ssize_t r;
  do {
    r = recv_with_fds(conn, &byte, 1, fds, &truncated);
  } while (r < 0 && errno == EINTR);
  if (r < 0) throw_errno(Errc::kCriu, "receive a pipe from criu");
  if (r == 0) throw Error(Errc::kCriu, "criu closed the streamer socket before passing a pipe");
  if (fds.empty()) throw Error(Errc::kCriu, "criu's streamer message carried no pipe");
  if (truncated || fds.size() > 1)
    throw Error(Errc::kCriu, "criu passed more descriptors than expected");
  return std::move(fds.front());
}

// Bigger pipes mean fewer wake-ups per MiB on both sides; the default (64 KiB) is kept if the
// system refuses (fs.pipe-max-size).
void grow_pipe(int fd) {
  for (int size : {4 << 20, 1 << 20}) {
    if (::fcntl(fd, F_SETPIPE_SZ, size) >= 0) return;
  }
}

void epoll_add(int ep, int fd, std::uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno(Errc::kInternal, "epoll_ctl");
}

constexpr std::uint64_t kTagListen = ~0ull, kTagStop = ~0ull - 1, kTagConn = ~0ull - 2;

}  // namespace

std::string stream_unsupported_reason(const fs::path& images_dir,
                                      const std::vector<std::string>& criu_args) {
  // CRIU's own refusals (page-xfer.c, pagemap.c) and what reads or links image files directly.
  static const char* const kNeedFiles[] = {"--prev-images-dir", "--track-mem",  "--lazy-pages",
                                           "--page-server",     "--auto-dedup", "--pre-dump"};
  for (const auto& a : criu_args)
    for (const char* opt : kNeedFiles)
      if (a == opt || a.rfind(std::string(opt) + "=", 0) == 0)
        return "criu option " + std::string(opt) + " needs image files on disk";
  const fs::path longest = images_dir / kCaptureSocket;
  if (longest.native().size() >= sizeof(sockaddr_un::sun_path))
    return "the staging path " + images_dir.string() + " is too long for CRIU's streamer socket";
  return {};
}

// ---- dump ---------------------------------------------------------------------------------------

DumpStreamer::DumpStreamer(const fs::path& dir, image::StreamPacker& packer)
    : packer_(packer), socket_path_(dir / kCaptureSocket), listen_(listen_on(socket_path_)) {
  thread_ = std::thread([this] { run(); });
}

DumpStreamer::~DumpStreamer() {
  if (thread_.joinable()) {
    stop_mode_ = 2;
    stop_.notify();
    thread_.join();
  }
  ::unlink(socket_path_.c_str());
}

void DumpStreamer::finish() {
  if (thread_.joinable()) {
    stop_mode_ = 1;
    stop_.notify();
    thread_.join();
  }
  ::unlink(socket_path_.c_str());
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

std::vector<std::string> DumpStreamer::files() const {
  std::lock_guard lock(mu_);
  return files_;
}

void DumpStreamer::run() {
  // Every descriptor lives in this scope: leaving it (an error, an abandon) closes them, and
  // CRIU gets a broken pipe instead of waiting for a reader that is gone.
  std::map<std::uint64_t, std::pair<UniqueFd, image::StreamPacker::FileId>> pipes;
  UniqueFd conn;
  try {
    UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
    if (!ep) throw_errno(Errc::kInternal, "epoll_create1");
    epoll_add(ep.get(), listen_.get(), kTagListen);
    epoll_add(ep.get(), stop_.fd(), kTagStop);
    bool connected = false, conn_done = false;
    std::uint64_t next_tag = 0;
    epoll_event evs[16];
    for (;;) {
      const int mode = stop_mode_.load();
      if (mode == 2) return;
      // criu has exited: whatever it sent is readable to the end, and nothing more will come.
      if (mode == 1 && (!connected || (conn_done && pipes.empty()))) break;
      if (connected && conn_done && pipes.empty()) break;
      const int n = ::epoll_wait(ep.get(), evs, 16, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno(Errc::kInternal, "epoll_wait");
      for (int i = 0; i < n; ++i) {
        const std::uint64_t tag = evs[i].data.u64;
        if (tag == kTagStop) {
          stop_.wait();
        } else if (tag == kTagListen) {
          UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
          if (!c) continue;
          if (connected) continue;  // one criu per streamer; a second connection is dropped
          connected = true;
          conn = std::move(c);
          epoll_add(ep.get(), conn.get(), kTagConn);
        } else if (tag == kTagConn) {
          const auto name = read_request(conn.get());
          if (!name) {
            ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, conn.get(), nullptr);
            conn.reset();
            conn_done = true;
            continue;
          }
          UniqueFd pipe = recv_pipe(conn.get());
          const int fl = ::fcntl(pipe.get(), F_GETFL);
          if (fl < 0 || ::fcntl(pipe.get(), F_SETFL, fl | O_NONBLOCK) != 0)
            throw_errno(Errc::kInternal, "fcntl");
          grow_pipe(pipe.get());
          spdlog::debug("criu streams {}", *name);
          const auto id = packer_.open(*name);
          {
            std::lock_guard lock(mu_);
            files_.push_back(*name);
          }
          const std::uint64_t t = next_tag++;
          epoll_add(ep.get(), pipe.get(), t);
          pipes.emplace(t, std::make_pair(std::move(pipe), id));
        } else {
          auto it = pipes.find(tag);
          if (it == pipes.end()) continue;
          const int fd = it->second.first.get();
          const auto id = it->second.second;
          // A bounded number of reads per wake-up keeps the other pipes moving.
          for (int k = 0; k < 64; ++k) {
            const auto room = packer_.space(id);
            const ssize_t r = ::read(fd, room.data(), room.size());
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && errno == EAGAIN) break;
            if (r < 0) throw_errno(Errc::kCriu, "read an image from criu");
            if (r == 0) {
              packer_.close(id);
              ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd, nullptr);
              pipes.erase(it);
              break;
            }
            packer_.commit(id, static_cast<std::size_t>(r));
          }
        }
      }
    }
  } catch (...) {
    std::lock_guard lock(mu_);
    error_ = std::current_exception();
  }
}

// ---- restore ------------------------------------------------------------------------------------

RestoreStreamer::RestoreStreamer(const fs::path& dir, const image::CheckpointSource& source)
    : source_(source), socket_path_(dir / kServeSocket), listen_(listen_on(socket_path_)) {
  thread_ = std::thread([this] { run(); });
}

RestoreStreamer::~RestoreStreamer() {
  if (thread_.joinable()) {
    stop_mode_ = 2;
    stop_.notify();
    thread_.join();
  }
  for (auto& t : servers_)
    if (t.joinable()) t.join();
  ::unlink(socket_path_.c_str());
}

void RestoreStreamer::finish() {
  if (thread_.joinable()) {
    stop_mode_ = 1;
    stop_.notify();
    thread_.join();
  }
  for (auto& t : servers_)
    if (t.joinable()) t.join();
  ::unlink(socket_path_.c_str());
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

bool RestoreStreamer::failed() const {
  std::lock_guard lock(mu_);
  return error_ != nullptr;
}

std::vector<std::string> RestoreStreamer::missing() const {
  std::lock_guard lock(mu_);
  return missing_;
}

void RestoreStreamer::fail(std::exception_ptr e) {
  std::lock_guard lock(mu_);
  if (!error_) error_ = e;
}

void RestoreStreamer::serve(const image::ManifestEntry* e, std::optional<Range> range,
                            UniqueFd pipe) {
  try {
    // criu asks for a task's pages once it has forked that task: a restore held here is half
    // done (tests stop it here).
    if (e->path.starts_with("pages-")) fault_point(fault::kRestorePages);
    // A false return is criu closing the image before its end: it needed no more of it (the
    // rest comes as ranges, or never).
    if (range)
      source_.write_range_to(*e, range->offset, range->length, pipe.get());
    else
      source_.write_to(*e, pipe.get());
    ++served_;
  } catch (...) {
    // Closing the pipe early makes criu fail on a truncated image: the damaged bytes never
    // reach a restored process.
    fail(std::current_exception());
  }
}

const image::ManifestEntry* RestoreStreamer::find_range(const std::string& name,
                                                        std::optional<Range>& range) const {
  if (const image::ManifestEntry* e = source_.find(name)) return e;
  const auto at = name.rfind('@');
  if (at == std::string::npos) return nullptr;
  // IMAGE@OFFSET+LENGTH, both decimal, nothing else.
  const std::string_view spec = std::string_view(name).substr(at + 1);
  const auto plus = spec.find('+');
  Range r;
  auto number = [](std::string_view t, std::uint64_t& v) {
    const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return !t.empty() && ec == std::errc() && p == t.data() + t.size();
  };
  if (plus == std::string_view::npos || !number(spec.substr(0, plus), r.offset) ||
      !number(spec.substr(plus + 1), r.length))
    return nullptr;
  const image::ManifestEntry* e = source_.find(std::string_view(name).substr(0, at));
  if (!e || r.length == 0 || r.offset > e->size || r.length > e->size - r.offset) return nullptr;
  range = r;
  return e;
}

void RestoreStreamer::run() {
  UniqueFd conn;
  try {
    UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
    if (!ep) throw_errno(Errc::kInternal, "epoll_create1");
    epoll_add(ep.get(), listen_.get(), kTagListen);
    epoll_add(ep.get(), stop_.fd(), kTagStop);
    bool connected = false;
    epoll_event evs[4];
    for (;;) {
      const int mode = stop_mode_.load();
      if (mode == 2) return;
      if (mode == 1 && !conn) break;  // criu exited and its socket is done (or never came)
      const int n = ::epoll_wait(ep.get(), evs, 4, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno(Errc::kInternal, "epoll_wait");
      for (int i = 0; i < n; ++i) {
        const std::uint64_t tag = evs[i].data.u64;
        if (tag == kTagStop) {
          stop_.wait();
        } else if (tag == kTagListen) {
          UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
          if (!c || connected) continue;
          connected = true;
          conn = std::move(c);
          epoll_add(ep.get(), conn.get(), kTagConn);
        } else if (tag == kTagConn) {
          const auto name = read_request(conn.get());
          if (!name) {
            ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, conn.get(), nullptr);
            conn.reset();
            continue;
          }
          std::optional<Range> range;
          const image::ManifestEntry* e = find_range(*name, range);
          send_reply(conn.get(), e != nullptr);
          if (!e) {
            std::lock_guard lock(mu_);
            missing_.push_back(*name);
            continue;
          }
          spdlog::debug("criu reads {} ({} bytes)", *name, e->size);
          UniqueFd pipe = recv_pipe(conn.get());
          grow_pipe(pipe.get());
          servers_.emplace_back(
              [this, e, range, p = std::make_shared<UniqueFd>(std::move(pipe))]() mutable {
                serve(e, range, std::move(*p));
              });
        }
      }
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

}  // namespace gpuckpt::criu
