// gpuckpt-vllm-demo: a serving process tree shaped like vLLM's, for checkpoint/restore tests
// without a GPU. The front (the tree's root) serves HTTP with epoll and forks one engine and N
// workers; the engine broadcasts steps to the workers over a shared-memory ring in /dev/shm
// and the workers answer on unix sockets. See tools/README.md.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gpuckpt/error.h"
#include "shared.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace gpuckpt::vllm_demo {

void warn(std::string_view role, const std::string& msg) {
  std::cerr << "gpuckpt-vllm-demo " << role << ": " << msg << std::endl;
}

bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

namespace {

using nlohmann::json;

constexpr std::size_t kMaxHeader = 64 << 10;
constexpr std::size_t kMaxBody = 1 << 20;
constexpr int kMaxTokens = 1024;
constexpr std::uint64_t kListenerKey = 0, kEngineKey = 1;  // epoll keys; connections count up

volatile sig_atomic_t g_term = 0, g_child = 0;
void on_term(int) {
  g_term = 1;
}
void on_child(int) {
  g_child = 1;
}

struct Options {
  std::string host = "127.0.0.1", port_file;
  int port = 8000, workers = 2;
  double weights_mib = 16, init_seconds = 0;
  std::uint64_t seed = 1;
  bool keep_shm = false;
};

UniqueFd listen_tcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    throw Error(Errc::kUsage, "cannot resolve --host " + host + ": " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
  UniqueFd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(Errc::kIo, "socket");
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0)
    throw_errno(Errc::kIo, "bind ", host, ":", port);
  if (::listen(fd.get(), 128) != 0) throw_errno(Errc::kIo, "listen");
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    throw_errno(Errc::kIo, "getsockname");
  return ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
}

std::pair<UniqueFd, UniqueFd> socket_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw_errno(Errc::kIo, "socketpair");
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

struct Children {
  pid_t engine = 0;
  std::vector<pid_t> workers;
  std::string name(pid_t pid) const {
    if (pid == engine) return "engine (pid " + std::to_string(pid) + ")";
    for (std::size_t r = 0; r < workers.size(); ++r)
      if (workers[r] == pid)
        return "worker " + std::to_string(r) + " (pid " + std::to_string(pid) + ")";
    return "pid " + std::to_string(pid);
  }
  std::vector<pid_t> all() const {
    std::vector<pid_t> v{engine};
    v.insert(v.end(), workers.begin(), workers.end());
    return v;
  }
};

// Forks a child that keeps only the fds in `keep` of those in `all`. It dies with the front
// (PR_SET_PDEATHSIG), so a killed front never leaves orphans behind.
template <class Body>
pid_t fork_child(const char* comm, const sigset_t& mask, const std::vector<int>& all,
                 const std::vector<int>& keep, Body body) {
  const pid_t front = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno(Errc::kInternal, "fork");
  if (pid > 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != front) ::_exit(1);  // the front died before prctl
  ::prctl(PR_SET_NAME, comm);
  for (int sig : {SIGTERM, SIGINT, SIGCHLD}) ::signal(sig, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  for (int fd : all)
    if (std::find(keep.begin(), keep.end(), fd) == keep.end()) ::close(fd);
  const int rc = body();
  std::fflush(nullptr);
  ::_exit(rc);
}

// One request per connection, answered with "Connection: close": no idle client
// connection is ever open, which is what a checkpoint between requests wants.
struct Conn {
  UniqueFd fd;
  std::string in, out;
  bool asked = false;  // the request was routed; the answer is in `out` or with the engine
  bool done = false;   // the whole answer is in `out`
};

class Front {
 public:
  Front(const Options& o, UniqueFd listener, UniqueFd engine, Children children)
      : o_(o),
        listener_(std::move(listener)),
        engine_(std::move(engine)),
        children_(std::move(children)),
        ep_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (!ep_) throw_errno(Errc::kInternal, "epoll_create1");
    port_ = bound_port(listener_.get());
    if (::fcntl(engine_.get(), F_SETFL, O_NONBLOCK) != 0) throw_errno(Errc::kInternal, "fcntl");
    watch(listener_.get(), EPOLL_CTL_ADD, EPOLLIN, kListenerKey);
    watch(engine_.get(), EPOLL_CTL_ADD, EPOLLIN, kEngineKey);
  }

  // Serves until SIGTERM/SIGINT (0) or until a child dies or the engine hangs up (1).
  int run(const sigset_t& wait_mask) {
    epoll_event ev[64];
    for (;;) {
      // Signals are blocked except inside epoll_pwait: none is lost between the checks below
      // and the wait, and an idle front sleeps here.
      const int n = ::epoll_pwait(ep_.get(), ev, 64, -1, &wait_mask);
      if (n < 0 && errno != EINTR) throw_errno(Errc::kInternal, "epoll_pwait");
      if (g_term) return shutdown(true);
      if (g_child) {
        g_child = 0;
        int st;
        if (const pid_t pid = ::waitpid(-1, &st, WNOHANG); pid > 0) {
          warn("front", children_.name(pid) + " exited (" + describe(st) + "); stopping");
          forget(pid);
          return shutdown(false);
        }
      }
      for (int i = 0; i < n; ++i) {
        const std::uint64_t key = ev[i].data.u64;
        if (key == kListenerKey) {
          accept_all();
        } else if (key == kEngineKey) {
          if (!engine_io(ev[i].events)) {
            warn("front", "the engine hung up; stopping");
            return shutdown(false);
          }
        } else {
          conn_io(key, ev[i].events);
        }
      }
    }
  }

 private:
  static std::string describe(int st) {
    if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
    return std::string("signal ") + ::strsignal(WTERMSIG(st));
  }

  void watch(int fd, int op, std::uint32_t events, std::uint64_t key) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = key;
    if (::epoll_ctl(ep_.get(), op, fd, &e) != 0) throw_errno(Errc::kInternal, "epoll_ctl");
  }

  void forget(pid_t pid) {
    if (pid == children_.engine) children_.engine = 0;
    for (pid_t& w : children_.workers)
      if (w == pid) w = 0;
  }

  // Graceful: hanging up on the engine makes it stop the workers; each exits on its own.
  // Otherwise (a child died), and while the workers still load (the engine waits for them,
  // not for the front), the rest get SIGTERM. Either way every child is reaped, within a
  // bound, before the front exits.
  int shutdown(bool graceful) {
    conns_.clear();
    listener_.reset();
    engine_.reset();
    std::vector<pid_t> live;
    for (pid_t p : children_.all())
      if (p > 0) live.push_back(p);
    const bool terminate = !graceful || !ready_;
    if (terminate)
      for (pid_t p : live) ::kill(p, SIGTERM);
    bool clean = graceful;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    const timespec step{10, 0};
    while (!live.empty()) {
      int st;
      const pid_t pid = ::waitpid(-1, &st, WNOHANG);
      if (pid > 0) {
        const bool expected = terminate && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM;
        if (!expected && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
          warn("front", children_.name(pid) + " ended with " + describe(st));
          clean = false;
        }
        live.erase(std::remove(live.begin(), live.end(), pid), live.end());
        continue;
      }
      if (pid < 0 && errno == ECHILD) break;
      if (::sigtimedwait(&chld, nullptr, &step) < 0 && errno == EAGAIN) {
        warn("front", "children still running after 10 s; killing them");
        for (pid_t p : live) ::kill(p, SIGKILL);
        clean = false;
      }
    }
    return clean ? 0 : 1;
  }

  void accept_all() {
    for (;;) {
      UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EMFILE || errno == ENFILE) return;
        throw_errno(Errc::kIo, "accept");
      }
      const std::uint64_t key = next_key_++;
      watch(fd.get(), EPOLL_CTL_ADD, EPOLLIN, key);
      conns_[key].fd = std::move(fd);
    }
  }

  // Reads and writes the engine socket; false once the engine hung up.
  bool engine_io(std::uint32_t events) {
    if (events & EPOLLOUT) flush_engine();
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return true;
    if (!read_some(engine_.get(), engine_in_)) return false;
    for (std::size_t nl; (nl = engine_in_.find('\n')) != std::string::npos;) {
      const json msg = json::parse(engine_in_.substr(0, nl));
      engine_in_.erase(0, nl + 1);
      if (msg.contains("event")) {  // the workers have mapped the ring
        ready_ = true;
        std::printf("READY http://%s:%d workers=%d shm=%s\n", o_.host.c_str(), port_, o_.workers,
                    msg["shm"].get<std::string>().c_str());
        std::fflush(stdout);
        continue;
      }
      const auto it = conns_.find(msg["id"].get<std::uint64_t>());
      if (it == conns_.end()) continue;  // the client went away meanwhile
      const int prompt_tokens = msg["prompt_tokens"], completion_tokens = msg["completion_tokens"];
      const json body = {
          {"id", "cmpl-" + std::to_string(msg["request"].get<std::uint64_t>())},
          {"object", "text_completion"},
          {"model", "gpuckpt-vllm-demo"},
          {"choices", {{{"index", 0}, {"text", msg["text"]}, {"finish_reason", "length"}}}},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
      respond(it->second, 200, body);
      flush(it->first, it->second);
    }
    return true;
  }

  void flush_engine() {
    while (!engine_out_.empty()) {
      const ssize_t n = ::send(engine_.get(), engine_out_.data(), engine_out_.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN: EPOLLOUT resumes it; a dead engine shows as EPOLLHUP
      engine_out_.erase(0, static_cast<std::size_t>(n));
    }
    watch(engine_.get(), EPOLL_CTL_MOD, EPOLLIN | (engine_out_.empty() ? 0u : +EPOLLOUT),
          kEngineKey);
  }

  // Appends what a non-blocking fd has to `buf`; false at EOF or on an error.
  static bool read_some(int fd, std::string& buf) {
    char chunk[65536];
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return true;
      if (n <= 0) return false;
      buf.append(chunk, static_cast<std::size_t>(n));
    }
  }

  void conn_io(std::uint64_t key, std::uint32_t events) {
    auto it = conns_.find(key);
    if (it == conns_.end()) return;
    Conn& c = it->second;
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !read_some(c.fd.get(), c.in)) {
      conns_.erase(it);  // the client went away: an answer still with the engine is dropped
      return;
    }
    if (c.asked)
      c.in.clear();  // bytes after the request: not read as another one
    else
      parse(key, c);
    flush(key, c);
  }

  // Routes the request once c.in holds all of it: the header and a Content-Length body.
  void parse(std::uint64_t key, Conn& c) {
    const auto head_end = c.in.find("\r\n\r\n");
    if (head_end == std::string::npos) {
      if (c.in.size() > kMaxHeader) error(c, 431, "request header too large");
      return;
    }
    std::string head = c.in.substr(0, head_end);
    std::transform(head.begin(), head.end(), head.begin(), ::tolower);  // header names
    const auto cl = head.find("\r\ncontent-length:");
    const std::size_t length =
        cl == std::string::npos ? 0 : std::strtoull(head.c_str() + cl + 17, nullptr, 10);
    if (length > kMaxBody) return error(c, 413, "body over " + std::to_string(kMaxBody) + " bytes");
    if (c.in.size() < head_end + 4 + length) return;
    std::string method, path;
    std::istringstream(c.in.substr(0, c.in.find("\r\n"))) >> method >> path;
    route(key, c, method, path.substr(0, path.find('?')), c.in.substr(head_end + 4, length));
  }

  void route(std::uint64_t key, Conn& c, const std::string& method, const std::string& path,
             const std::string& body) {
    const std::string want = path == "/v1/completions" ? "POST" : "GET";
    if (path != "/health" && path != "/v1/models" && path != "/v1/completions")
      return error(c, 404, "no route " + path);
    if (method != want) return error(c, 405, "use " + want);
    if (path == "/health") return respond(c, ready_ ? 200 : 503, {}, ready_ ? "ok\n" : "loading\n");
    if (path == "/v1/models")
      return respond(
          c, 200,
          {{"object", "list"}, {"data", {{{"id", "gpuckpt-vllm-demo"}, {"object", "model"}}}}});
    if (!ready_) return error(c, 503, "the workers are still loading");
    const json req = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!req.is_object()) return error(c, 400, "the body is not a JSON object");
    // json defaults: value() would throw on a field of another type, not answer 400.
    const json prompt = req.value("prompt", json());
    const json session = req.value("session", json("default"));
    const json max_tokens = req.value("max_tokens", json(16));
    if (!prompt.is_string()) return error(c, 400, "\"prompt\" must be a string");
    if (!max_tokens.is_number_integer() || max_tokens < 1 || max_tokens > kMaxTokens)
      return error(c, 400, "\"max_tokens\" must be an integer in 1.." + std::to_string(kMaxTokens));
    if (!session.is_string() || session.get<std::string>().size() > kMaxSession)
      return error(c, 400, "\"session\" must be a string of at most 256 bytes");
    const json job = {
        {"id", key}, {"session", session}, {"prompt", prompt}, {"max_tokens", max_tokens}};
    engine_out_ += job.dump() + "\n";
    c.asked = true;
    flush_engine();
  }

  // Queues the whole answer: `body` as JSON, or `text` as text/plain.
  void respond(Conn& c, int status, const json& body, const std::string& text = {}) {
    static const std::map<int, const char*> kReasons = {{200, "OK"},
                                                        {400, "Bad Request"},
                                                        {404, "Not Found"},
                                                        {405, "Method Not Allowed"},
                                                        {413, "Content Too Large"},
                                                        {431, "Request Header Fields Too Large"},
                                                        {503, "Service Unavailable"}};
    const std::string payload = body.is_null() ? text : body.dump() + "\n";
    c.out = "HTTP/1.1 " + std::to_string(status) + " " + kReasons.at(status) +
            "\r\nContent-Type: " + (body.is_null() ? "text/plain" : "application/json") +
            "\r\nContent-Length: " + std::to_string(payload.size()) +
            "\r\nConnection: close\r\n\r\n" + payload;
    c.asked = c.done = true;
  }

  void error(Conn& c, int status, const std::string& message) {
    respond(c, status, {{"error", {{"message", message}, {"code", status}}}});
  }

  void flush(std::uint64_t key, Conn& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return watch(c.fd.get(), EPOLL_CTL_MOD, EPOLLOUT, key);
      if (n < 0) break;  // the client is gone
      c.out.erase(0, static_cast<std::size_t>(n));
    }
    if (c.done || !c.out.empty()) conns_.erase(key);
  }

  const Options& o_;
  UniqueFd listener_, engine_;
  Children children_;
  UniqueFd ep_;
  int port_ = 0;
  bool ready_ = false;
  std::string engine_in_, engine_out_;
  std::map<std::uint64_t, Conn> conns_;
  std::uint64_t next_key_ = 2;
};

int run(const Options& o) {
  UniqueFd listener = listen_tcp(o.host, o.port);
  const int port = bound_port(listener.get());

  // Signals reach the front only inside epoll_pwait (see Front::run); the children get back
  // the mask and default actions they would have had.
  sigset_t block, old;
  sigemptyset(&block);
  for (int sig : {SIGTERM, SIGINT, SIGCHLD}) sigaddset(&block, sig);
  ::sigprocmask(SIG_BLOCK, &block, &old);
  struct sigaction sa {};
  sa.sa_handler = on_term;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = on_child;
  sa.sa_flags = SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto [front_end, engine_end] = socket_pair();
  std::vector<UniqueFd> engine_ends, worker_ends;
  for (int r = 0; r < o.workers; ++r) {
    auto [e, w] = socket_pair();
    engine_ends.push_back(std::move(e));
    worker_ends.push_back(std::move(w));
  }
  std::vector<int> all{listener.get(), front_end.get(), engine_end.get()};
  EngineOptions eo{engine_end.get(), {}, o.keep_shm};
  for (auto& fd : engine_ends) eo.workers.push_back(fd.get());
  for (auto& fd : engine_ends) all.push_back(fd.get());
  for (auto& fd : worker_ends) all.push_back(fd.get());

  Children children;
  std::vector<int> keep = eo.workers;
  keep.push_back(eo.front);
  children.engine = fork_child("vllm-engine", old, all, keep, [&] { return run_engine(eo); });
  for (int r = 0; r < o.workers; ++r) {
    WorkerOptions wo{r, worker_ends[r].get(),
                     static_cast<std::uint64_t>(o.weights_mib * double(1 << 20)), o.seed,
                     o.init_seconds};
    const std::string comm = "vllm-worker-" + std::to_string(r);
    children.workers.push_back(
        fork_child(comm.c_str(), old, all, {wo.socket}, [&] { return run_worker(wo); }));
  }
  // Only the children hold their ends now: a child's exit is EOF for the peer.
  engine_end.reset();
  engine_ends.clear();
  worker_ends.clear();

  if (!o.port_file.empty()) write_file_atomic(o.port_file, std::to_string(port) + "\n");
  Front front(o, std::move(listener), std::move(front_end), children);
  return front.run(old);
}

}  // namespace
}  // namespace gpuckpt::vllm_demo

int main(int argc, char** argv) {
  using gpuckpt::vllm_demo::Options;
  CLI::App app{"gpuckpt-vllm-demo: an HTTP serving tree shaped like vLLM (front, engine, workers)"};
  Options o;
  app.add_option("--host", o.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "TCP port; 0 picks a free one (see --port-file)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--port-file", o.port_file, "Write the bound port here once listening");
  app.add_option("--workers", o.workers, "Worker processes")
      ->check(CLI::Range(1, gpuckpt::vllm_demo::kMaxWorkers))
      ->capture_default_str();
  app.add_option("--weights-mib", o.weights_mib, "Weights per worker, in anonymous memory")
      ->check(CLI::Range(0.001, 1048576.0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the weights")->capture_default_str();
  app.add_option("--init-seconds", o.init_seconds, "Model-load delay of each worker")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--keep-shm", o.keep_shm, "Keep the ring's /dev/shm name until exit");
  CLI11_PARSE(app, argc, argv);
  try {
    return gpuckpt::vllm_demo::run(o);
  } catch (const gpuckpt::Error& e) {
    gpuckpt::vllm_demo::warn("front", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    gpuckpt::vllm_demo::warn("front", e.what());
    return 1;
  }
}
