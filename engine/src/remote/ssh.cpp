#include "remote/ssh.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "gpuckpt/error.h"
#include "image/manifest.h"
#include "util/fs.h"
#include "util/no_sigpipe.h"
#include "util/unique_fd.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

namespace gpuckpt::remote {

namespace {

// Pipes of 64 KiB cost a context switch per 64 KiB between us and ssh; 1 MiB (the default
// limit for unprivileged pipes) does not. Best effort: a socket or file is left as it is.
void widen_pipe(int fd) {
  ::fcntl(fd, F_SETPIPE_SZ, 1 << 20);
}

constexpr std::string_view kMagic = "GPUCKPT-STREAM 2";
constexpr std::size_t kMaxHeader = 4096;
constexpr std::uint64_t kMaxFile = 1ull << 40;
constexpr std::size_t kMaxBlobs = 1u << 16;  // 64 TiB of 1 GiB blobs: a stream with more lies

void write_all(int fd, const char* p, std::size_t n, const char* what) {
  if (const int err = write_fully(fd, p, n)) throw_syserr(Errc::kIo, err, what);
}

void write_line(int fd, const nlohmann::json& j) {
  const std::string line = j.dump() + "\n";
  write_all(fd, line.data(), line.size(), "send the checkpoint to the target");
}

// Waits until `fd` has data, or Error(kIo) once `cancel` (an eventfd; -1: none) is signalled.
void wait_readable(int fd, int cancel) {
  if (cancel < 0) return;
  pollfd p[2] = {{fd, POLLIN, 0}, {cancel, POLLIN, 0}};
  for (;;) {
    const int r = ::poll(p, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno(Errc::kIo, "poll the checkpoint stream");
    if (p[1].revents) throw Error(Errc::kIo, "the rest of the checkpoint stream was not read");
    return;
  }
}

// One '\n'-terminated line, read a byte at a time so that nothing past it is consumed (the
// commit line follows the stream on the same descriptor).
std::string read_line(int fd, int cancel = -1) {
  std::string s;
  for (;;) {
    wait_readable(fd, cancel);
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::kIo, "read the checkpoint stream");
    if (n == 0)
      throw Error(Errc::kIo, "the checkpoint stream ended early (the connection was lost)");
    if (c == '\n') return s;
    if (s.size() >= kMaxHeader) throw Error(Errc::kCorrupt, "checkpoint stream: header too long");
    s += c;
  }
}

bool valid_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos &&
         n.find('\0') == std::string::npos;
}

struct Header {
  bool end = false;
  bool blob = false;  // a piece of a blob, else a whole file (the seal, the manifest)
  std::string name;
  std::uint64_t offset = 0, size = 0;
};

Header parse_header(const std::string& line) {
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kCorrupt, std::string("checkpoint stream: bad header: ") + e.what());
  }
  if (!h.is_object()) throw Error(Errc::kCorrupt, "checkpoint stream: bad header");
  Header out;
  try {
    out.end = h.value("end", false);
    if (out.end) return out;
    out.blob = h.contains("blob");
    out.name = h.value(out.blob ? "blob" : "name", std::string());
    out.offset = h.value("offset", std::uint64_t{0});
    out.size = h.value("size", std::uint64_t{0});
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kCorrupt, std::string("checkpoint stream: bad header: ") + e.what());
  }
  if (!valid_name(out.name) || out.size > kMaxFile || out.offset > kMaxFile - out.size)
    throw Error(Errc::kCorrupt, "checkpoint stream: bad file '" + out.name + "'");
  return out;
}

UniqueFd create_file(const fs::path& p) {
  UniqueFd out(::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!out) throw_errno(Errc::kIo, "create ", p);
  return out;
}

// Copies the next `size` bytes of the stream `in` to `offset` of `out`.
void copy_into(int in, int out, std::uint64_t offset, std::uint64_t size, const std::string& name,
               std::vector<char>& buf, int cancel = -1) {
  std::uint64_t done = 0;
  while (done < size) {
    wait_readable(in, cancel);
    const ssize_t n = ::read(in, buf.data(), std::min<std::uint64_t>(size - done, buf.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::kIo, "read the checkpoint stream");
    if (n == 0)
      throw Error(Errc::kIo, "the checkpoint stream ended in the middle of " + name +
                                 " (the connection was lost)");
    if (const int err = pwrite_fully(out, buf.data(), static_cast<std::size_t>(n), offset + done))
      throw_syserr(Errc::kIo, err, "write ", name);
    done += static_cast<std::uint64_t>(n);
  }
}

}  // namespace

std::string SshTarget::str() const {
  return "ssh://" + (user.empty() ? "" : user + "@") + host +
         (port ? ":" + std::to_string(port) : "");
}

bool is_ssh_url(std::string_view s) {
  return s.starts_with("ssh://");
}

SshTarget parse_ssh_url(std::string_view s) {
  if (!is_ssh_url(s)) throw Error(Errc::kUsage, "not an ssh:// URL: " + std::string(s));
  std::string rest(s.substr(6));
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  SshTarget t;
  if (const auto at = rest.find('@'); at != std::string::npos) {
    t.user = rest.substr(0, at);
    rest = rest.substr(at + 1);
  }
  if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      throw Error(Errc::kUsage, "bad port in " + std::string(s));
    t.port = std::stoi(port);
    rest = rest.substr(0, colon);
  }
  t.host = rest;
  auto ok = [](const std::string& v, bool host) {
    if (v.empty() || v.front() == '-') return false;
    for (char c : v)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
            (host && c == ':')))
        return false;
    return true;
  };
  if (!ok(t.host, false) || (!t.user.empty() && !ok(t.user, false)))
    throw Error(Errc::kUsage,
                "bad host or user in " + std::string(s) + " (expected ssh://[user@]host[:port])");
  return t;
}

std::vector<std::string> ssh_command(const SshTarget& t, const fs::path& config) {
  std::vector<std::string> a{
      "ssh", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
      "-T"};
  if (!config.empty()) {
    a.push_back("-F");
    a.push_back(config.string());
  }
  if (t.port) {
    a.push_back("-p");
    a.push_back(std::to_string(t.port));
  }
  a.push_back("--");
  a.push_back(t.user.empty() ? t.host : t.user + "@" + t.host);
  return a;
}

constexpr std::uint64_t kPiece = 8ull << 20;

struct StreamSender::State {
  struct Sent {
    image::IntervalSet sent;
  };
  std::mutex mu;
  std::condition_variable cv;
  image::TappedBlobs<Sent> blobs;
  // Once the manifest is out: what the restore reads first, sent before the rest.
  std::deque<image::BlobRange> first;
  std::string seal, manifest;
  bool manifest_given = false, manifest_sent = false;
  bool stop = false, done = false;
  std::exception_ptr error;
  std::string why;  // the error's message, for the packer's tap calls
  std::uint64_t sent = 0, total = 0;
  std::uint64_t moved = 0;  // blob bytes written so far, pieces whole or not
  ProgressFn progress;

  void check() const {
    if (error) throw Error(Errc::kIo, "the checkpoint could not be sent: " + why);
  }
};

StreamSender::StreamSender(int fd)
    : fd_(::fcntl(fd, F_DUPFD_CLOEXEC, 0)), st_(std::make_unique<State>()) {
  if (!fd_) throw_errno(Errc::kIo, "dup the connection's descriptor");
  thread_ = std::thread([this] { run(); });
}

StreamSender::~StreamSender() {
  {
    std::lock_guard lock(st_->mu);
    st_->stop = true;
  }
  st_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StreamSender::blob_created(std::uint32_t blob, const fs::path& path) {
  {
    std::lock_guard lock(st_->mu);
    st_->check();
    st_->blobs.created(blob, path);
  }
  st_->cv.notify_all();
}

void StreamSender::blob_written(std::uint32_t blob, std::uint64_t end) {
  {
    std::lock_guard lock(st_->mu);
    st_->check();
    st_->blobs.written(blob, end);
  }
  st_->cv.notify_all();
}

void StreamSender::run() {
  NoSigpipe nosig;  // a closed connection is an error here, not the end of gpuckpt
  State& st = *st_;
  try {
    widen_pipe(fd_.get());
    const std::string magic = std::string(kMagic) + "\n";
    write_all(fd_.get(), magic.data(), magic.size(), "send the checkpoint to the target");
    std::unique_lock lock(st.mu);
    // The next piece: [begin, end) of blob `blob`.
    struct Piece {
      std::size_t blob;
      std::uint64_t begin, end;
    };
    auto next_piece = [&]() -> std::optional<Piece> {
      while (!st.first.empty()) {
        const auto& r = st.first.front();
        const auto [b, e] = st.blobs[r.blob].sent.first_gap(r.begin, r.end);
        if (b < e) return Piece{r.blob, b, std::min(e, b + kPiece)};
        st.first.pop_front();
      }
      for (std::size_t i = 0; i < st.blobs.size(); ++i) {
        const auto [b, e] = st.blobs[i].sent.first_gap(0, st.blobs[i].written);
        if (b < e) return Piece{i, b, std::min(e, b + kPiece)};
      }
      return std::nullopt;
    };
    for (;;) {
      st.cv.wait(lock, [&] {
        return st.stop || (st.manifest_given && !st.manifest_sent) || next_piece().has_value() ||
               st.manifest_sent;
      });
      if (st.stop) return;
      if (first_ == std::chrono::steady_clock::time_point{})
        first_ = std::chrono::steady_clock::now();
      if (st.manifest_given && !st.manifest_sent) {
        // As soon as it exists: the target's restore starts on it while the rest comes.
        lock.unlock();
        for (const auto& [name, text] :
             {std::pair{image::kSealName, &st.seal}, {image::kManifestName, &st.manifest}}) {
          write_line(fd_.get(), {{"name", name}, {"size", text->size()}});
          write_all(fd_.get(), text->data(), text->size(), "send the checkpoint to the target");
        }
        lock.lock();
        st.manifest_sent = true;
        st.sent += st.seal.size() + st.manifest.size();
        continue;
      }
      const auto piece = next_piece();
      if (!piece) {  // the manifest is out, and every byte it lists
        lock.unlock();
        write_line(fd_.get(), {{"end", true}});
        lock.lock();
        st.done = true;
        st.cv.notify_all();
        return;
      }
      const int in = st.blobs[piece->blob].fd.get();
      const std::string name = st.blobs[piece->blob].name;
      const std::uint64_t off = piece->begin, len = piece->end - piece->begin;
      lock.unlock();
      write_line(fd_.get(), {{"blob", name}, {"offset", off}, {"size", len}});
      for (off_t pos = static_cast<off_t>(off); pos < static_cast<off_t>(off + len);) {
        const ssize_t n =
            ::sendfile(fd_.get(), in, &pos,
                       static_cast<std::size_t>(off + len - static_cast<std::uint64_t>(pos)));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno(Errc::kIo, "send ", name, " to the target");
        if (n == 0) throw Error(Errc::kIo, name + " ended before its written bytes were sent");
        {
          // Every byte the target takes is progress, even on a link slower than a piece a minute.
          std::lock_guard progress(st.mu);
          st.moved += static_cast<std::uint64_t>(n);
        }
        st.cv.notify_all();
      }
      lock.lock();
      st.blobs[piece->blob].sent.add(off, off + len);
      st.sent += len;
      if (st.progress)
        st.progress(
            {"transfer", st.sent, st.total,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - first_).count()});
    }
  } catch (const std::exception& e) {
    std::lock_guard lock(st.mu);
    st.error = std::current_exception();
    st.why = e.what();
    st.cv.notify_all();
  }
}

bool StreamSender::failed() const {
  std::lock_guard lock(st_->mu);
  return static_cast<bool>(st_->error);
}

std::uint64_t StreamSender::finish(const fs::path& dir, const ProgressFn& progress,
                                   std::chrono::seconds stall) {
  const image::Manifest m = image::load_manifest(dir);
  std::string seal = read_file(dir / image::kSealName);
  std::string manifest = read_file(dir / image::kManifestName);
  State& st = *st_;
  {
    std::unique_lock lock(st.mu);
    st.check();
    st.blobs.published(dir, m);
    for (const auto& b : m.blobs) st.total += b.size;
    const auto first = image::ranges_needed_first(m);
    st.first.assign(first.begin(), first.end());
    st.total += seal.size() + manifest.size();
    st.seal = std::move(seal);
    st.manifest = std::move(manifest);
    st.manifest_given = true;
    st.progress = progress;
    st.cv.notify_all();
    // Every write the target takes wakes this wait, so a quiet stretch means a stalled target.
    for (std::uint64_t seen = st.moved; !(st.done || st.error); seen = st.moved) {
      if (!st.cv.wait_for(lock, stall, [&] { return st.done || st.error || st.moved != seen; }))
        throw Error(Errc::kTimeout, "the target took none of the checkpoint for " +
                                        std::to_string(stall.count()) + " s (" +
                                        std::to_string(st.sent) + " of " +
                                        std::to_string(st.total) + " bytes sent)");
    }
  }
  thread_.join();
  if (st.error) std::rethrow_exception(st.error);
  fd_.reset();  // the stream is whole: ssh sees its end
  return st.sent;
}

namespace {

// The receiver fails the stream rather than fill the disk of a node that runs other services:
// it leaves 2% of the spool's filesystem free, at most 1 GiB. Before the manifest it cannot know
// the checkpoint's size, so it checks each piece; once the manifest is in, all that is to come.
void check_room(const fs::path& dir, std::uint64_t more) {
  std::error_code ec;
  const fs::space_info sp = fs::space(dir, ec);
  if (ec) return;  // cannot tell: the writes will say
  const std::uint64_t reserve = std::min<std::uint64_t>(1ull << 30, sp.capacity / 50);
  if (sp.available >= reserve && sp.available - reserve >= more) return;
  auto mib = [](std::uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  throw Error(Errc::kIo, "the spool's filesystem (" + dir.string() + ") has " + mib(sp.available) +
                             " free; the checkpoint stream needs " + mib(more) +
                             " more there, and gpuckpt leaves " + mib(reserve) +
                             " free for the rest of the host: free space there or choose another "
                             "--spool");
}

}  // namespace

struct StreamReceiver::Blob {
  UniqueFd fd;
  image::IntervalSet got;  // written; before the manifest, always [0, n) (pieces in order)
  std::size_t index = 0;   // in the manifest (once it is in)
  std::uint64_t size = 0;  // in the manifest
  std::uint64_t end() const {
    return got.intervals().empty() ? 0 : got.intervals().rbegin()->second;
  }
};

StreamReceiver::StreamReceiver(int fd, const fs::path& dir) : fd_(fd), dir_(dir), buf_(1 << 20) {
  widen_pipe(fd);
  if (read_line(fd) != kMagic)
    throw Error(Errc::kCorrupt,
                "not a gpuckpt checkpoint stream (expected '" + std::string(kMagic) + "')");
  // The pieces that come before the manifest, then the seal and the manifest.
  bool seal = false;
  for (;;) {
    const Header h = parse_header(read_line(fd));
    if (h.end) throw Error(Errc::kCorrupt, "checkpoint stream: it ended without its manifest");
    if (h.blob) {
      piece(h.name, h.offset, h.size);
      continue;
    }
    if ((h.name != image::kSealName || seal) && h.name != image::kManifestName)
      throw Error(Errc::kCorrupt, "checkpoint stream: unexpected file '" + h.name + "'");
    if (h.size > image::kMaxManifestBytes)
      throw Error(Errc::kCorrupt, "checkpoint stream: " + h.name + " is too large");
    check_room(dir, h.size);
    UniqueFd out = create_file(dir / h.name);
    copy_into(fd, out.get(), 0, h.size, h.name, buf_);
    received_ += h.size;
    if (h.name == image::kManifestName) break;
    seal = true;
  }
  const image::Manifest m = image::load_manifest(dir);  // the seal before anything else
  for (std::size_t i = 0; i < m.blobs.size(); ++i) {
    auto& b = blobs_[m.blobs[i].name];
    if (m.blobs[i].size > kMaxFile)
      throw Error(Errc::kCorrupt, "checkpoint stream: blob '" + m.blobs[i].name +
                                      "' is larger than a stream carries");
    if (!b) {
      b = std::make_unique<Blob>();
      b->fd = create_file(dir / m.blobs[i].name);
    } else if (b->end() > m.blobs[i].size) {
      throw Error(Errc::kCorrupt, "checkpoint stream: blob '" + m.blobs[i].name +
                                      "' is larger than its manifest says");
    }
    b->index = i;
    b->size = m.blobs[i].size;
    // Readers need every blob at its full size; its bytes still to come fill it in.
    if (::ftruncate(b->fd.get(), static_cast<off_t>(b->size)) != 0)
      throw_errno(Errc::kIo, "size ", dir / m.blobs[i].name);
    order_.push_back(b.get());
  }
  if (order_.size() != blobs_.size())
    throw Error(Errc::kCorrupt, "checkpoint stream: a blob came that its manifest does not list");
  std::uint64_t to_come = 0;
  for (const Blob* b : order_) to_come += b->size - b->end();  // pieces so far: [0, end)
  check_room(dir_, to_come);
  // The check alone holds for one writer only: the space is taken now, so that a second
  // migration into this spool, or any other writer, fails here instead of filling the disk.
  for (std::size_t i = 0; i < order_.size(); ++i) {
    const Blob& b = *order_[i];
    if (b.size == b.end()) continue;
    if (::fallocate(b.fd.get(), 0, static_cast<off_t>(b.end()),
                    static_cast<off_t>(b.size - b.end())) != 0 &&
        errno != EOPNOTSUPP)  // a filesystem without it: the check above is what holds
      throw_errno(Errc::kIo, "reserve ", (b.size - b.end()) >> 20, " MiB in the spool for ",
                  dir_ / m.blobs[i].name);
  }
  arrival_ = std::make_unique<image::BlobArrival>(order_.size());
  for (std::size_t i = 0; i < order_.size(); ++i)
    for (const auto& [begin, end] : order_[i]->got.intervals()) arrival_->add(i, begin, end);
}

StreamReceiver::~StreamReceiver() {
  if (thread_.joinable()) thread_.join();
}

void StreamReceiver::piece(const std::string& name, std::uint64_t offset, std::uint64_t size) {
  if (name == image::kSealName || name == image::kManifestName)
    throw Error(Errc::kCorrupt, "checkpoint stream: a piece of '" + name + "'");
  auto it = blobs_.find(name);
  if (it == blobs_.end()) {
    if (arrival_)
      throw Error(Errc::kCorrupt,
                  "checkpoint stream: '" + name + "' is not a blob of its manifest");
    if (blobs_.size() >= kMaxBlobs)
      throw Error(Errc::kCorrupt, "checkpoint stream: too many blobs");
    auto b = std::make_unique<Blob>();
    b->fd = create_file(dir_ / name);
    it = blobs_.emplace(name, std::move(b)).first;
  }
  Blob& b = *it->second;
  // Before the manifest the pieces follow each other; after it they may come in any order
  // (what the restore reads first, first), but inside the blob and never twice.
  if ((!arrival_ && offset != b.end()) || (arrival_ && offset + size > b.size) ||
      b.got.overlaps(offset, offset + size))
    throw Error(Errc::kCorrupt, "checkpoint stream: a piece of '" + name + "' out of place");
  if (!arrival_) check_room(dir_, size);  // after the manifest, checked for the whole at once
  copy_into(fd_, b.fd.get(), offset, size, name, buf_, cancel_.fd());
  b.got.add(offset, offset + size);
  received_ += size;
  if (arrival_) arrival_->add(b.index, offset, offset + size);
}

void StreamReceiver::start() {
  thread_ = std::thread([this] {
    try {
      receive_rest();
      arrival_->finish();
    } catch (const std::exception& e) {
      error_ = std::current_exception();
      arrival_->fail(e.what());
    }
  });
}

std::uint64_t StreamReceiver::join() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(error_);
  return received_;
}

void StreamReceiver::receive_rest() {
  for (;;) {
    const Header h = parse_header(read_line(fd_, cancel_.fd()));
    if (h.end) {
      ended_ = std::chrono::steady_clock::now();
      break;
    }
    if (!h.blob) throw Error(Errc::kCorrupt, "checkpoint stream: unexpected file '" + h.name + "'");
    piece(h.name, h.offset, h.size);
  }
  for (const Blob* b : order_)
    if (!b->got.covers(0, b->size))
      throw Error(Errc::kCorrupt, "checkpoint stream: it ended with a blob incomplete");
}

}  // namespace gpuckpt::remote
