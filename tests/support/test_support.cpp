#include "test_support.h"

#include "gpuckpt/names.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/process.h"
#include "probe/probe.h"
#include "process/proc_info.h"
#include "util/poll_timeout.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::test {

fs::path bin_dir() {
  return GPUCKPT_BIN_DIR;
}
fs::path gpuckpt_binary() {
  return bin_dir() / "gpuckpt";
}

TempDir scratch_dir(const std::string& name) {
  const char* t = std::getenv("TMPDIR");
  TempDir dir(t ? t : "/tmp", name);
  dir.unmark();  // a test's own: its listings see only what the test made there
  return dir;
}

TmpfsMount::TmpfsMount(const fs::path& at, const std::string& opts) : at_(at) {
  fs::create_directories(at);
  ok_ = ::mount("tmpfs", at.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  if (!ok_) err_ = errno;
}

TmpfsMount::~TmpfsMount() {
  if (ok_) ::umount2(at_.c_str(), MNT_DETACH);
}

std::string TmpfsMount::why() const {
  return std::strerror(err_);
}

CliResult run_cli(const std::vector<std::string>& args, int timeout_s) {
  std::vector<std::string> argv{gpuckpt_binary().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  TempDir tmp = scratch_dir("gpuckpt-cli");
  SpawnOptions opts;
  opts.stderr_file = tmp.path() / "stderr";
  CliResult r;
  try {
    RunResult rr = run_capture(argv, std::chrono::seconds(timeout_s), opts);
    r.exit_code = rr.status.exited ? rr.status.code : 128 + rr.status.code;
    r.out = std::move(rr.output);
  } catch (const Error& e) {
    r.exit_code = -1;
    r.err = e.what();
  }
  std::error_code ec;
  if (fs::exists(opts.stderr_file, ec)) r.err += read_file(opts.stderr_file);
  return r;
}

Child paused_cli(const std::vector<std::string>& args, const std::string& point,
                 const fs::path& dir, Resume resume, const std::vector<std::string>& launcher) {
  // A point gpuckpt does not have would never pause it: the test would wait out its timeout.
  if (std::none_of(std::begin(fault::kAll), std::end(fault::kAll),
                   [&](const char* p) { return point == p; }))
    throw Error(Errc::kUsage, "no fault point '" + point + "' (gpuckpt/names.h)");
  const fs::path mark = dir / ("mark-" + point);
  fs::remove(mark);
  SpawnOptions o;
  o.env = {"GPUCKPT_FAULT_PAUSE=" + point, "GPUCKPT_FAULT_MARK=" + mark.string()};
  if (resume == Resume::kOnInterrupt) o.env.push_back("GPUCKPT_FAULT_RESUME=interrupt");
  if (resume == Resume::kWhenUnmarked) o.env.push_back("GPUCKPT_FAULT_RESUME=unmark");
  o.stderr_file = dir / "cli.err";
  o.stdout_file = dir / "cli.out";
  std::vector<std::string> argv = launcher;
  argv.push_back(gpuckpt_binary().string());
  argv.insert(argv.end(), args.begin(), args.end());
  Child c = spawn(argv, o);
  EXPECT_TRUE(wait_until([&] { return fs::exists(mark); }, std::chrono::seconds(60)))
      << "gpuckpt never reached " << point << ": " << read_file(dir / "cli.err");
  return c;
}

void resume_paused(const fs::path& dir, const std::string& point) {
  fs::remove(dir / ("mark-" + point));
}

void write_test_file(const fs::path& path, std::uint64_t size, std::uint64_t seed,
                     double random_fraction) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw_errno(Errc::kIo, "create ", path);
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> buf(1 << 17);  // 1 MiB blocks
  const std::uint64_t random_bytes = static_cast<std::uint64_t>(size * random_fraction);
  std::uint64_t written = 0;
  while (written < size) {
    if (written < random_bytes) {
      for (auto& w : buf) w = rng();
    } else {
      // fp16-like: small-magnitude values with shared exponents, like activations in a KV cache.
      auto* h = reinterpret_cast<std::uint16_t*>(buf.data());
      for (size_t i = 0; i < buf.size() * 4; ++i) {
        std::uint16_t mant = static_cast<std::uint16_t>(rng() & 0x3f);  // low-entropy mantissa
        h[i] = static_cast<std::uint16_t>(0x3c00 | (rng() & 0x8000) | mant);
      }
    }
    const size_t n = static_cast<size_t>(std::min<std::uint64_t>(buf.size() * 8, size - written));
    if (::write(fd.get(), buf.data(), n) != static_cast<ssize_t>(n))
      throw_errno(Errc::kIo, "write ", path);
    written += n;
  }
}

bool damage_last_pages_chunk(const fs::path& checkpoint) {
  std::ifstream in(checkpoint / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, false);
  if (!m.is_object()) return false;
  nlohmann::json last;
  for (const auto& e : m["entries"])
    if (e.value("path", "").starts_with("pages-") && !e["chunks"].empty())
      last = e["chunks"].back();
  if (!last.is_object()) return false;
  char blob[32];
  std::snprintf(blob, sizeof blob, "blob-%06d.bin", last["blob"].get<int>());
  std::fstream f(checkpoint / blob, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(last["offset"].get<std::streamoff>() + last["stored"].get<std::streamoff>() / 2);
  const char junk[64] = "damaged damaged damaged damaged damaged damaged damaged damag";
  f.write(junk, sizeof junk);
  return static_cast<bool>(f);
}

bool same_contents(const fs::path& a, const fs::path& b) {
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  if (!fa || !fb) return false;
  std::vector<char> ba(1 << 20), bb(1 << 20);
  for (;;) {
    fa.read(ba.data(), ba.size());
    fb.read(bb.data(), bb.size());
    if (fa.gcount() != fb.gcount()) return false;
    if (std::memcmp(ba.data(), bb.data(), fa.gcount()) != 0) return false;
    if (!fa) return !fb;
  }
}

namespace {

using Clock = std::chrono::steady_clock;

// Waits for `events` on `fd` until the deadline; throws Error(kTimeout) naming `what`.
void wait_fd(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (r > 0) return;
    if (r == 0) throw Error(Errc::kTimeout, what + ": timed out");
    if (errno != EINTR) throw_errno(Errc::kInternal, "poll");
  }
}

}  // namespace

HttpResponse http_request(int port, const std::string& method, const std::string& path,
                          const std::string& body, std::chrono::milliseconds timeout,
                          const std::string& host) {
  const auto deadline = Clock::now() + timeout;
  const std::string what = method + " http://" + host + ":" + std::to_string(port) + path;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1)
    throw Error(Errc::kUsage, what + ": not an IPv4 address");
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(Errc::kInternal, "socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    if (errno != EINPROGRESS) throw_errno(Errc::kProcess, what);
    wait_fd(fd.get(), POLLOUT, deadline, what);
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) throw_syserr(Errc::kProcess, err, what);
  }
  std::string msg = method + " " + path + " HTTP/1.1\r\nHost: " + host + ":" +
                    std::to_string(port) + "\r\nConnection: close\r\n";
  if (!body.empty())
    msg +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  msg += "\r\n" + body;
  for (std::size_t off = 0; off < msg.size();) {
    const ssize_t n = ::send(fd.get(), msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n >= 0) {
      off += static_cast<std::size_t>(n);
    } else if (errno == EAGAIN) {
      wait_fd(fd.get(), POLLOUT, deadline, what);
    } else if (errno != EINTR) {
      throw_errno(Errc::kProcess, what);
    }
  }
  std::string in;
  char chunk[65536];
  for (;;) {  // Connection: close: the answer ends at EOF
    wait_fd(fd.get(), POLLIN, deadline, what);
    const ssize_t n = ::recv(fd.get(), chunk, sizeof chunk, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0 && errno == ECONNRESET && !in.empty()) break;
    if (n < 0) throw_errno(Errc::kProcess, what);
    if (n == 0) break;
    in.append(chunk, static_cast<std::size_t>(n));
  }
  const auto head_end = in.find("\r\n\r\n");
  if (in.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos)
    throw Error(Errc::kProcess, what + ": no HTTP answer (got '" + in.substr(0, 200) + "')");
  HttpResponse r;
  r.status = std::atoi(in.c_str() + in.find(' ') + 1);
  r.body = in.substr(head_end + 4);
  std::string head = in.substr(0, head_end);
  std::transform(head.begin(), head.end(), head.begin(), ::tolower);
  if (const auto cl = head.find("\r\ncontent-length:"); cl != std::string::npos) {
    const std::size_t length = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
    if (r.body.size() < length) throw Error(Errc::kProcess, what + ": answer body cut short");
    r.body.resize(length);
  }
  return r;
}

std::string http_post_json(int port, const std::string& path, const std::string& json,
                           std::chrono::milliseconds timeout) {
  HttpResponse r = http_request(port, "POST", path, json, timeout);
  if (r.status < 200 || r.status > 299)
    throw Error(Errc::kProcess,
                "POST " + path + " answered " + std::to_string(r.status) + ": " + r.body);
  return std::move(r.body);
}

std::string vllm_complete(int port, const std::string& session, const std::string& prompt,
                          int max_tokens) {
  const nlohmann::json req = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"session", session}};
  const auto reply = nlohmann::json::parse(http_post_json(port, "/v1/completions", req.dump()));
  return reply.at("choices").at(0).at("text").get<std::string>();
}

VllmDemo start_vllm_demo(const fs::path& dir, const std::vector<std::string>& args,
                         std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const fs::path port_file = dir / "vllm-demo.port";
  fs::remove(port_file);
  VllmDemo d;
  d.log = dir / "vllm-demo.log";
  std::vector<std::string> argv{(bin_dir() / "gpuckpt-vllm-demo").string(), "--port", "0",
                                "--port-file", port_file.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions so;
  so.stdout_file = d.log;
  so.stderr_file = d.log;
  so.new_session = true;
  d.front = spawn(argv, so);
  const auto exited = [&] {
    if (auto st = d.front.wait_for(std::chrono::milliseconds(0)))
      throw Error(Errc::kProcess, "gpuckpt-vllm-demo exited (" + st->describe() +
                                      ") before it answered; its log:\n" + read_file(d.log));
  };
  // The port file appears (atomically) as soon as the port is bound; the wait on the child
  // paces the polling and notices an early exit.
  while (!fs::exists(port_file)) {
    if (auto st = d.front.wait_for(std::chrono::milliseconds(10)))
      throw Error(Errc::kProcess, "gpuckpt-vllm-demo exited (" + st->describe() +
                                      ") before it listened; its log:\n" + read_file(d.log));
    if (Clock::now() > deadline)
      throw Error(Errc::kTimeout, "gpuckpt-vllm-demo wrote no port file within " +
                                      std::to_string(timeout.count()) + " ms");
  }
  d.port = std::stoi(read_file(port_file));
  ReadinessProbe health = parse_probe("http://127.0.0.1:" + std::to_string(d.port) + "/health");
  health.timeout = std::chrono::milliseconds(std::max(poll_timeout_ms(deadline), 1));
  wait_ready(health, exited);
  return d;
}

std::vector<pid_t> descendants(pid_t root) {
  std::multimap<pid_t, pid_t> children;  // ppid -> pid
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    // A process that ends while its stat is read is one no longer there (read_proc: nullopt).
    const auto info = process::read_proc(std::stoi(name));
    if (!info || info->state == 'Z' || info->state == 'X') continue;
    children.emplace(info->ppid, info->pid);
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (auto [it, end] = children.equal_range(p); it != end; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace gpuckpt::test

namespace gpuckpt::test {

void close_inherited_fds() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::stoi(e.path().filename().string());
    if (fd > 2) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
}

int free_tcp_port() {
  const auto bind_to = [](int port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<std::uint16_t>(port));
    socklen_t len = sizeof sa;
    if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
      return 0;
    return static_cast<int>(ntohs(sa.sin_port));
  };
  // Below the kernel's ephemeral range: between this check and the server's own bind, no
  // connect() or bind(0) of this test or of one running beside it is ever given this port, as
  // a port the kernel chose (the old way) could be.
  int low = 0;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> low;
  constexpr int kFrom = 10000;
  if (low > kFrom + 1000) {
    static std::mutex mu;
    static std::mt19937 rng(std::random_device{}());
    for (int attempt = 0; attempt < 200; ++attempt) {
      int port;
      {
        std::lock_guard lk(mu);
        port = std::uniform_int_distribution<int>(kFrom, low - 1)(rng);
      }
      if (bind_to(port) == port) return port;
    }
  }
  if (const int port = bind_to(0)) return port;
  throw_errno(Errc::kInternal, "cannot find a free TCP port");
}

UniqueFd unix_listener(const fs::path& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(fd.get(), 8) != 0)
    throw_errno(Errc::kInternal, "unix listener");
  return fd;
}

Error error_from(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than gpuckpt::Error: " << e.what();
    return Error(Errc::kInternal, std::string("not a gpuckpt::Error: ") + e.what());
  }
  ADD_FAILURE() << "returned instead of throwing";
  return Error(Errc::kInternal, "nothing was thrown");
}

bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a condition
  }
  return true;
}

char process_state(pid_t pid) {
  // Not an ifstream: a read of a process that ends meanwhile fails (ESRCH), which its
  // streambuf throws past the stream's flags.
  const auto info = process::read_proc(pid);
  return info ? info->state : 0;
}

ExitStatus signalled_at(const std::vector<std::string>& args, const std::string& point, int sig,
                        const std::filesystem::path& dir,
                        const std::vector<std::string>& launcher) {
  Child g = paused_cli(args, point, dir, Resume::kNever, launcher);
  g.kill(sig);
  return g.wait();
}

std::vector<std::filesystem::path> container_restore_dirs(const std::string& id) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& root : std::filesystem::directory_iterator("/run/gpuckpt/containers", ec))
    if (std::filesystem::exists(root.path() / id, ec)) out.push_back(root.path() / id);
  return out;
}

void remove_container_restore_dirs(const std::string& id) {
  std::error_code ec;
  for (const auto& d : container_restore_dirs(id)) std::filesystem::remove_all(d, ec);
}

bool runs_again(pid_t pid) {
  return wait_until([&] {
    const char c = process_state(pid);
    return c != 'T' && c != 't';
  });
}

}  // namespace gpuckpt::test

namespace gpuckpt::test {

S3Server::S3Server(const std::string& bucket) : dir_(scratch_dir("gpuckpt-s3")), bucket_(bucket) {
  start({}, "127.0.0.1");
}

S3Server::S3Server(const std::string& bucket, const NetNs& ns)
    : dir_(scratch_dir("gpuckpt-s3")), bucket_(bucket) {
  start(ns.wrap({}), "0.0.0.0");
}

void S3Server::start(const std::vector<std::string>& prefix, const std::string& address) {
  const char* env = std::getenv("GPUCKPT_S3RVER");
  const fs::path bin =
      env && *env ? fs::path(env) : fs::path("/opt/gpuckpt-s3rver/node_modules/.bin/s3rver");
  if (!fs::exists(bin))
    throw Error(Errc::kInvalidInput,
                bin.string() + " is not installed: run scripts/install-s3rver.sh (setup.sh does)");
  SpawnOptions o;
  o.capture_stdout = true;
  o.new_session = true;
  o.stderr_file = dir_.path() / "s3rver.err";
  std::vector<std::string> argv = prefix;
  for (const auto& a :
       {bin.string(), std::string("-d"), (dir_.path() / "data").string(), std::string("-a"),
        address, std::string("-p"), std::string("0"), std::string("--configure-bucket"), bucket_})
    argv.push_back(a);
  child_ = spawn(argv, o);
  // It says "S3rver listening on ADDRESS:PORT" once it accepts connections.
  const std::string said = "listening on " + address + ":";
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (port_ == 0) {
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(Errc::kTimeout, "s3rver did not start: " + out);
    pollfd p{child_.stdout_fd(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(child_.stdout_fd(), buf, sizeof buf);
    if (n <= 0)
      throw Error(Errc::kProcess, "s3rver exited: " + out + read_file(dir_.path() / "s3rver.err"));
    out.append(buf, static_cast<std::size_t>(n));
    const auto at = out.find(said);
    if (at != std::string::npos && out.find('\n', at) != std::string::npos)
      port_ = std::atoi(out.c_str() + at + said.size());
  }
}

S3Server::~S3Server() {
  stop();
}

void S3Server::stop() {
  if (!child_.running()) return;
  child_.kill(SIGKILL);
  child_.wait();
}

std::string S3Server::endpoint() const {
  return endpoint("127.0.0.1");
}

std::string S3Server::endpoint(const std::string& address) const {
  return "http://" + address + ":" + std::to_string(port_);
}

void S3Server::export_environment() const {
  ::setenv("AWS_ENDPOINT_URL", endpoint().c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);  // s3rver's built-in account
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  ::unsetenv("AWS_ENDPOINT_URL_S3");
  ::unsetenv("AWS_PROFILE");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent", 1);
  ::setenv("AWS_CONFIG_FILE", "/nonexistent", 1);
}

}  // namespace gpuckpt::test

namespace gpuckpt::test {

namespace {

void run_checked(const std::vector<std::string>& argv) {
  const RunResult r = run_capture(argv, std::chrono::seconds(60));
  if (!r.status.ok()) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw Error(Errc::kInternal, cmd + "failed: " + r.status.describe());
  }
}

}  // namespace

NetNs::NetNs(const std::string& tag) : name_("gpuckpt-" + tag + "-" + std::to_string(::getpid())) {
  run_checked({"ip", "netns", "add", name_});
  run_checked({"ip", "netns", "exec", name_, "ip", "link", "set", "lo", "up"});
}

NetNs::~NetNs() {
  for (pid_t p : processes()) ::kill(p, SIGKILL);
  wait_until([&] { return processes().empty(); }, std::chrono::seconds(30));
  run_capture({"ip", "netns", "del", name_}, std::chrono::seconds(60));
}

PodSandbox::PodSandbox(const std::string& tag) : net_(tag) {
  SpawnOptions o;
  o.capture_stdout = true;
  sandbox_ = spawn(net_.wrap({"unshare", "--ipc", "--uts", "--", "sh", "-c",
                              "hostname " + tag + " && echo up && exec sleep 86400"}),
                   o);
  // It says so once its hostname is set: a blocking read, not a wait.
  char buf[8] = {};
  if (::read(sandbox_.stdout_fd(), buf, sizeof buf - 1) != 3)
    throw Error(Errc::kInternal, "the sandbox of pod " + tag + " did not start");
}

std::string PodSandbox::ns_path(const std::string& type) const {
  return "/proc/" + std::to_string(sandbox_.pid()) + "/ns/" + type;
}

std::string PodSandbox::outside(pid_t p) const {
  std::string out;
  for (const char* type : {"net", "ipc", "uts"})
    if (namespace_inode("/proc/" + std::to_string(p) + "/ns/" + type) !=
        namespace_inode(ns_path(type)))
      out += std::string(out.empty() ? "" : " ") + type;
  return out;
}

std::string PodSandbox::hostname() const {
  return run_capture({"nsenter", "-t", std::to_string(pid()), "-u", "hostname"},
                     std::chrono::seconds(30))
      .output;
}

int PodSandbox::make_sysv_segment() const {
  const RunResult r =
      run_capture({"nsenter", "-t", std::to_string(pid()), "-i", "ipcmk", "-M", "4096"},
                  std::chrono::seconds(30));
  // "Shared memory id: N"
  const auto colon = r.output.rfind(':');
  if (!r.status.ok() || colon == std::string::npos)
    throw Error(Errc::kInternal, "ipcmk in the pod failed: " + r.output);
  return std::atoi(r.output.c_str() + colon + 1);
}

std::size_t PodSandbox::sysv_segments() const {
  const std::string out = run_capture({"nsenter", "-t", std::to_string(pid()), "-i", "ipcs", "-m"},
                                      std::chrono::seconds(30))
                              .output;
  std::size_t n = 0;  // one line per segment, from its key
  for (std::size_t at = 0; (at = out.find("\n0x", at)) != std::string::npos; ++at) ++n;
  return n;
}

std::uint64_t namespace_inode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

std::vector<std::string> NetNs::wrap(const std::vector<std::string>& argv) const {
  // nsenter, not `ip netns exec`: only the network namespace changes, so processes started
  // this way share the mount namespace with CRIU and with each other, as on a real host.
  std::vector<std::string> v{"nsenter", "--net=/run/netns/" + name_, "--"};
  v.insert(v.end(), argv.begin(), argv.end());
  return v;
}

void NetNs::enter_this_thread() const {
  UniqueFd fd(::open(("/run/netns/" + name_).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw_errno(Errc::kInternal, "open /run/netns/", name_);
  if (::setns(fd.get(), CLONE_NEWNET) != 0) throw_errno(Errc::kInternal, "setns ", name_);
}

std::vector<pid_t> NetNs::processes() const {
  struct stat mine {};
  if (::stat(("/run/netns/" + name_).c_str(), &mine) != 0) return {};
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string n = e.path().filename().string();
    if (n.empty() || !std::all_of(n.begin(), n.end(), ::isdigit)) continue;
    struct stat st {};
    if (::stat((e.path() / "ns/net").c_str(), &st) != 0) continue;
    if (st.st_ino == mine.st_ino && st.st_dev == mine.st_dev) {
      const char c = process_state(std::stoi(n));
      if (c != 0 && c != 'Z') out.push_back(std::stoi(n));
    }
  }
  return out;
}

void NetNs::link(const NetNs& other, const std::string& mine, const std::string& theirs) const {
  // Interface names are at most 15 characters, and unique per pair on this machine.
  static int pairs = 0;
  const std::string tag = std::to_string(::getpid() % 100000) + "x" + std::to_string(pairs++);
  const std::string a = "gva" + tag, b = "gvb" + tag;
  run_checked({"ip", "link", "add", a, "netns", name_, "type", "veth", "peer", "name", b, "netns",
               other.name_});
  run_checked(wrap({"ip", "addr", "add", mine, "dev", a}));
  run_checked(wrap({"ip", "link", "set", a, "up"}));
  run_checked(other.wrap({"ip", "addr", "add", theirs, "dev", b}));
  run_checked(other.wrap({"ip", "link", "set", b, "up"}));
}

SshHost::SshHost(const NetNs& ns, const fs::path& dir, const std::string& alias,
                 const std::string& proxy_prefix, const std::vector<std::string>& env)
    : config_(dir / "ssh_config"), alias_(alias) {
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  fs::create_directories("/run/sshd");  // sshd's privilege separation directory
  for (const char* k : {"host_key", "client_key"}) {
    fs::remove(dir / k);
    fs::remove(dir / (std::string(k) + ".pub"));
    run_checked({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuckpt-test", "-f",
                 (dir / k).string()});
  }
  fs::copy_file(dir / "client_key.pub", dir / "authorized_keys",
                fs::copy_options::overwrite_existing);
  std::string set_env;
  for (const auto& e : env) set_env += " " + e;
  std::ofstream(dir / "sshd_config")
      << "HostKey " << (dir / "host_key").string() << "\n"
      << "AuthorizedKeysFile " << (dir / "authorized_keys").string() << "\n"
      << "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
         "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n"
         "LogLevel ERROR\n"
         "SetEnv PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
      << set_env << "\n";
  const std::string host_pub = read_file(dir / "host_key.pub");
  std::ofstream(dir / "known_hosts")
      << alias << " " << host_pub.substr(0, host_pub.rfind(' ')) << "\n";
  std::ofstream(config_) << "Host " << alias << "\n"
                         << "  User root\n"
                         << "  ProxyCommand " << proxy_prefix << " nsenter --net=/run/netns/"
                         << ns.name() << " -- /usr/sbin/sshd -i -f "
                         << (dir / "sshd_config").string() << "\n"
                         << "  IdentityFile " << (dir / "client_key").string() << "\n"
                         << "  IdentitiesOnly yes\n"
                         << "  UserKnownHostsFile " << (dir / "known_hosts").string() << "\n"
                         << "  StrictHostKeyChecking yes\n";
}

bool wait_unlocked(pid_t pid) {
  const char* run = std::getenv("GPUCKPT_RUN_DIR");
  const fs::path dir = run && *run ? run : "/run/gpuckpt";
  const std::string tail = "-" + std::to_string(pid) + "-";
  return wait_until([&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!name.starts_with(".lock-") || name.find(tail, 6) == std::string::npos) continue;
      UniqueFd fd(::open(e.path().c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
      if (fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;  // still held
    }
    return true;
  });
}

// ---- FakeCudaTree ----

namespace {
// What the NVIDIA module's /proc file says, for a gpuckpt that loads the test driver.
constexpr const char* kFakeModuleVersionLine =
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  (gpuckpt's test driver)";
}  // namespace

FakeCudaTree::FakeCudaTree(int procs) : dir(scratch_dir("gpuckpt-fake-cuda")) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  fs::create_directory(state_dir());
  { std::ofstream(device_file()) << "stands for /dev/nvidia0\n"; }
  { std::ofstream(dir.path() / "version") << kFakeModuleVersionLine << "\n"; }
  close_inherited_fds();
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir.path() / "worker.out";
  o.stderr_file = dir.path() / "worker.err";
  root = spawn({GPUCKPT_FAKE_CUDA_WORKER, device_file().string(), std::to_string(procs)}, o);
  const bool ready = wait_until([&] {
    pids = {root.pid()};
    for (pid_t p : descendants(root.pid())) pids.push_back(p);
    if (static_cast<int>(pids.size()) != procs) return false;
    for (pid_t p : pids)
      if (restore_thread(p) == 0) return false;
    return true;
  });
  EXPECT_TRUE(ready) << "the fake CUDA workers did not start";
}

FakeCudaTree::~FakeCudaTree() {
  // Only the tree's own processes: each is this test's child (it is their subreaper) or a child
  // of another of them. A pid a test reaped already may name an unrelated process by now.
  for (pid_t p : pids)
    if (const auto i = process::read_proc(p);
        i && (i->ppid == ::getpid() || std::find(pids.begin(), pids.end(), i->ppid) != pids.end()))
      ::kill(p, SIGKILL);
  for (pid_t p : pids) reap(p);
}

std::vector<std::string> FakeCudaTree::env(int together) const {
  std::vector<std::string> e = {
      std::string("GPUCKPT_LIBCUDA=") + GPUCKPT_FAKE_CUDA_DRIVER,
      std::string("GPUCKPT_LIBCUDA_PATH=") + GPUCKPT_FAKE_CUDA_DRIVER,
      "GPUCKPT_TEST_NVIDIA_VERSION_FILE=" + (dir.path() / "version").string(),
      "GPUCKPT_PLUGIN_TEST_DEVICE_PREFIX=" + device_file().string(),
      "GPUCKPT_FAKE_CUDA_DIR=" + state_dir().string()};
  if (together > 0) {
    e.push_back("GPUCKPT_FAKE_CUDA_CHECKPOINTS_TOGETHER=" + std::to_string(together));
    e.push_back("GPUCKPT_FAKE_CUDA_RESTORES_TOGETHER=" + std::to_string(together));
  }
  return e;
}

int FakeCudaTree::cuda_state(pid_t pid) const {
  std::ifstream in(state_dir() / std::to_string(pid));
  int s = 0;  // no file: running
  in >> s;
  return s;
}

std::vector<FakeCudaCall> FakeCudaTree::calls() const {
  std::vector<FakeCudaCall> v;
  std::ifstream in(state_dir() / "calls.log");
  for (FakeCudaCall c; in >> c.op >> c.pid >> c.start_ns >> c.end_ns >> c.result;) v.push_back(c);
  return v;
}

pid_t FakeCudaTree::restore_thread(pid_t pid) {
  std::error_code ec;
  for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream comm(t.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name == "cuda-restore")
      return static_cast<pid_t>(std::stoi(t.path().filename().string()));
  }
  return 0;
}

bool FakeCudaTree::reap(pid_t pid) {
  return wait_until([pid] {
    const pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    return r == pid || (r < 0 && errno == ECHILD);
  });
}

std::vector<std::string> on_cgroup2(std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"unshare", "--mount", "--propagation", "private", "sh", "-c",
                             "mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"", "sh"});
  return argv;
}

}  // namespace gpuckpt::test
