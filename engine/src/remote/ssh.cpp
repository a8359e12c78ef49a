#include "remote/ssh.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>
#include <vector>

#include "gpuckpt/error.h"
#include "image/manifest.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::remote {

namespace {

// Pipes of 64 KiB cost a context switch per 64 KiB between us and ssh; 1 MiB (the default
// limit for unprivileged pipes) does not. Best effort: a socket or file is left as it is.
void widen_pipe(int fd) {
  ::fcntl(fd, F_SETPIPE_SZ, 1 << 20);
}

constexpr std::string_view kMagic = "GPUCKPT-STREAM 1";
constexpr std::size_t kMaxHeader = 4096;
constexpr std::uint64_t kMaxFile = 1ull << 40;

void write_all(int fd, const char* p, std::size_t n, const char* what) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw_errno(Errc::kIo, what);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// One '\n'-terminated line, read a byte at a time so that nothing past it is consumed (the
// commit line follows the stream on the same descriptor).
std::string read_line(int fd) {
  std::string s;
  for (;;) {
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
  std::string name;
  std::uint64_t size = 0;
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
  out.end = h.value("end", false);
  if (out.end) return out;
  out.name = h.value("name", std::string());
  out.size = h.value("size", std::uint64_t{0});
  if (!valid_name(out.name) || out.size > kMaxFile)
    throw Error(Errc::kCorrupt, "checkpoint stream: bad file '" + out.name + "'");
  return out;
}

UniqueFd create_file(const fs::path& p) {
  UniqueFd out(::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!out) throw_errno(Errc::kIo, "create ", p);
  return out;
}

// Copies the next `size` bytes of the stream `in` into `out`, telling `arrival` (if any) how
// far blob `index` has come after every read.
void copy_into(int in, int out, std::uint64_t size, const std::string& name,
               image::BlobArrival* arrival, std::size_t index) {
  std::vector<char> buf(1 << 20);
  std::uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(in, buf.data(), std::min<std::uint64_t>(size - done, buf.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::kIo, "read the checkpoint stream");
    if (n == 0)
      throw Error(Errc::kIo, "the checkpoint stream ended in the middle of " + name +
                                 " (the connection was lost)");
    std::size_t off = 0;
    while (off < static_cast<std::size_t>(n)) {
      const ssize_t w = ::pwrite(out, buf.data() + off, static_cast<std::size_t>(n) - off,
                                 static_cast<off_t>(done + off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw_errno(Errc::kIo, "write ", name);
      off += static_cast<std::size_t>(w);
    }
    done += static_cast<std::uint64_t>(n);
    if (arrival) arrival->advance(index, done);
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

std::uint64_t send_checkpoint(const fs::path& dir, int fd, const ProgressFn& progress) {
  std::vector<fs::path> files;
  std::uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    files.push_back(e.path());
    total += e.file_size();
  }
  // The seal and the manifest first: the receiver then knows every chunk while the blobs come.
  std::stable_partition(files.begin(), files.end(), [](const fs::path& p) {
    return p.filename() == image::kSealName || p.filename() == image::kManifestName;
  });
  widen_pipe(fd);
  const std::string magic = std::string(kMagic) + "\n";
  write_all(fd, magic.data(), magic.size(), "send the checkpoint");
  std::uint64_t sent = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& p : files) {
    UniqueFd in(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!in) throw_errno(Errc::kIo, "open ", p);
    struct stat st {};
    if (::fstat(in.get(), &st) != 0) throw_errno(Errc::kIo, "stat ", p);
    const std::string hdr = nlohmann::json{{"name", p.filename().string()},
                                           {"size", static_cast<std::uint64_t>(st.st_size)},
                                           {"mode", st.st_mode & 07777}}
                                .dump() +
                            "\n";
    write_all(fd, hdr.data(), hdr.size(), "send the checkpoint");
    off_t off = 0;
    while (off < st.st_size) {
      const ssize_t n = ::sendfile(
          fd, in.get(), &off, static_cast<std::size_t>(std::min<off_t>(st.st_size - off, 8 << 20)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno(Errc::kIo, "send ", p.filename(), " to the target");
      if (n == 0) throw Error(Errc::kIo, p.string() + " shrank while it was sent");
      sent += static_cast<std::uint64_t>(n);
      if (progress)
        progress({"transfer", sent, total,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
    }
  }
  const std::string end = "{\"end\":true}\n";
  write_all(fd, end.data(), end.size(), "send the checkpoint");
  return sent;
}

StreamReceiver::StreamReceiver(int fd, const fs::path& dir) : fd_(fd), dir_(dir) {
  widen_pipe(fd);
  if (read_line(fd) != kMagic)
    throw Error(Errc::kCorrupt,
                "not a gpuckpt checkpoint stream (expected '" + std::string(kMagic) + "')");
  // The seal and the manifest, then the first blob's header.
  for (;;) {
    pending_ = read_line(fd);
    const Header h = parse_header(pending_);
    if (h.end || (h.name != image::kManifestName && h.name != image::kSealName)) break;
    if (h.size > image::kMaxManifestBytes)
      throw Error(Errc::kCorrupt, "checkpoint stream: " + h.name + " is too large");
    UniqueFd out = create_file(dir / h.name);
    copy_into(fd, out.get(), h.size, h.name, nullptr, 0);
    received_ += h.size;
  }
  const image::Manifest m = image::load_manifest(dir);  // the seal before anything else
  for (const auto& b : m.blobs) {
    UniqueFd out = create_file(dir / b.name);
    if (::ftruncate(out.get(), static_cast<off_t>(b.size)) != 0)
      throw_errno(Errc::kIo, "size ", dir / b.name);
    blobs_.emplace_back(b.name, b.size);
  }
  arrival_ = std::make_unique<image::BlobArrival>(blobs_.size());
}

StreamReceiver::~StreamReceiver() {
  if (thread_.joinable()) thread_.join();
}

void StreamReceiver::start() {
  thread_ = std::thread([this] {
    try {
      receive_blobs();
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

void StreamReceiver::receive_blobs() {
  for (std::string line = pending_;; line = read_line(fd_)) {
    const Header h = parse_header(line);
    if (h.end) return;
    std::size_t index = blobs_.size();
    for (std::size_t i = 0; i < blobs_.size(); ++i)
      if (blobs_[i].first == h.name) index = i;
    if (index == blobs_.size() || blobs_[index].second != h.size)
      throw Error(Errc::kCorrupt, "checkpoint stream: '" + h.name +
                                      "' is not a blob of its manifest, or not of its size");
    UniqueFd out(::open((dir_ / h.name).c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!out) throw_errno(Errc::kIo, "open ", dir_ / h.name);
    copy_into(fd_, out.get(), h.size, h.name, arrival_.get(), index);
    received_ += h.size;
  }
}

}  // namespace gpuckpt::remote
