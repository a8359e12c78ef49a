// Readiness probe against real unix and TCP listeners that come up late, a real child's
// stdout, timeouts and malformed specs.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "probe/probe.h"
#include "test_support.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;

namespace {

// A TCP socket bound to an ephemeral port on 127.0.0.1 but not yet listening: connections are
// refused until listen(), which lets a test start the service "late" without a port race.
UniqueFd bound_tcp_socket(int& port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    throw_errno(Errc::kInternal, "tcp bind");
  port = ntohs(sa.sin_port);
  return fd;
}

std::string read_line(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') s.push_back(c);
  return s;
}

void write_all(int fd, const std::string& s) {
  ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
}

// Accepts one connection, reads a request line, answers "pong <request>".
void serve_one(int lfd) {
  UniqueFd c(::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC));
  if (!c) return;
  const std::string req = read_line(c.get());
  write_all(c.get(), "pong " + req + "\r\n");
}

// Reads one HTTP request: the header and a Content-Length body.
std::string read_http_request(int fd) {
  std::string req;
  char buf[4096];
  size_t want = std::string::npos;
  while (req.size() < want) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
    const auto end = req.find("\r\n\r\n");
    if (end != std::string::npos && want == std::string::npos) {
      const auto cl = req.find("Content-Length: ");
      want = end + 4 + (cl < end ? std::stoul(req.substr(cl + 16)) : 0);
    }
  }
  return req;
}

// A tiny HTTP server: one connection per answer, in order; each request is recorded. With
// `repeat`, the last answer is given to every further connection until the listener is shut
// down. The answer kHold is none: that connection is kept open, silent, until stop().
const std::string kHold = "(hold)";

class HttpServer {
 public:
  HttpServer(std::vector<std::string> answers, bool repeat = false)
      : listener_(bound_tcp_socket(port_)), answers_(std::move(answers)) {
    if (::listen(listener_.get(), 16) != 0) throw_errno(Errc::kInternal, "listen");
    thread_ = std::thread([this, repeat] {
      for (size_t i = 0; i < answers_.size() || repeat; ++i) {
        UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!c) return;  // shut down
        requests_.push_back(read_http_request(c.get()));
        const std::string& a = answers_[std::min(i, answers_.size() - 1)];
        if (a == kHold) {
          held_.push_back(std::move(c));
          continue;
        }
        if (::write(c.get(), a.data(), a.size()) < 0) return;
      }
    });
  }
  ~HttpServer() { stop(); }
  // Joins the server; after that requests() is safe to read.
  void stop() {
    ::shutdown(listener_.get(), SHUT_RDWR);  // wakes a blocked accept()
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  const std::vector<std::string>& requests() const { return requests_; }

 private:
  int port_ = 0;
  UniqueFd listener_;
  std::vector<std::string> answers_, requests_;
  std::vector<UniqueFd> held_;
  std::thread thread_;
};

std::string http_answer(const std::string& status, const std::string& body) {
  return "HTTP/1.1 " + status + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

TEST(ProbeParse, AcceptsTheThreeKinds) {
  auto u = parse_probe("unix:/run/llm.sock");
  EXPECT_EQ(u.kind, ReadinessProbe::Kind::kUnix);
  EXPECT_EQ(u.target, "/run/llm.sock");
  auto t = parse_probe("tcp:127.0.0.1:8000");
  EXPECT_EQ(t.kind, ReadinessProbe::Kind::kTcp);
  EXPECT_EQ(t.target, "127.0.0.1:8000");
  auto v6 = parse_probe("tcp:[::1]:65535");
  EXPECT_EQ(v6.kind, ReadinessProbe::Kind::kTcp);
  EXPECT_EQ(v6.target, "[::1]:65535");
  auto s = parse_probe("stdout:listening on port");
  EXPECT_EQ(s.kind, ReadinessProbe::Kind::kStdoutLine);
  EXPECT_EQ(s.target, "listening on port");
  EXPECT_EQ(describe_probe(t), "tcp:127.0.0.1:8000");
}

TEST(ProbeParse, HttpSpecsKeepHostPortAndPath) {
  auto h = parse_probe("http://127.0.0.1:8000/health");
  EXPECT_EQ(h.kind, ReadinessProbe::Kind::kHttp);
  EXPECT_EQ(h.target, "127.0.0.1:8000");
  EXPECT_EQ(h.path, "/health");
  EXPECT_EQ(describe_probe(h), "http://127.0.0.1:8000/health");
  auto root = parse_probe("http://[::1]:80");
  EXPECT_EQ(root.target, "[::1]:80");
  EXPECT_EQ(root.path, "/");
  EXPECT_EQ(parse_probe("http://svc:9/v1/models?x=1&y=%20").path, "/v1/models?x=1&y=%20");
}

TEST(ProbeParse, RejectsBadSpecsAsUsageErrors) {
  for (const std::string& bad : std::vector<std::string>{
           "", "unix", "unix:", "tcp:", "tcp:host", "tcp::80", "tcp:host:", "tcp:host:0",
           "tcp:host:65536", "tcp:host:8o", "tcp:host:123456", "stdout:", "https://x:80", "udp:x:1",
           "unix:" + std::string(200, 'a')}) {
    try {
      parse_probe(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kUsage) << bad;
      EXPECT_NE(std::string(e.what()).find("probe"), std::string::npos) << e.what();
    }
  }
}

TEST(ProbeParse, RejectsBadHttpSpecsAsUsageErrors) {
  const std::vector<std::string> bad = {"http:",       "http:x:80",   "http://",
                                        "http://x",    "http://x:0/", "http://:80/",
                                        "http://x:8a", "http//x:80/", "http://x:80/a b"};
  for (const std::string& spec : bad) {
    try {
      parse_probe(spec);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kUsage) << spec;
      EXPECT_NE(std::string(e.what()).find(spec), std::string::npos) << e.what();
    }
  }
}

TEST(ProbeWait, UnixListenerThatStartsLateAnswersTheRequest) {
  auto dir = test::scratch_dir();
  const fs::path sock = dir.path() / "svc.sock";
  std::atomic<int> attempts{0};
  std::thread server([&] {
    // The listener appears only after the probe has failed twice: so the probe must poll.
    while (attempts < 2) std::this_thread::yield();
    UniqueFd l = test::unix_listener(sock);
    serve_one(l.get());
  });
  auto p = parse_probe("unix:" + sock.string());
  p.request = "ping";
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p, [&] { ++attempts; }), "pong ping");
  EXPECT_GE(attempts, 2);
  server.join();
}

TEST(ProbeWait, TcpListenerThatStartsLateAnswersTheRequest) {
  int port = 0;
  UniqueFd l = bound_tcp_socket(port);
  std::atomic<int> attempts{0};
  std::thread server([&] {
    // Bound but not listening (refused) until the probe has failed twice: so it must poll.
    while (attempts < 2) std::this_thread::yield();
    ::listen(l.get(), 8);
    serve_one(l.get());
  });
  auto p = parse_probe("tcp:127.0.0.1:" + std::to_string(port));
  p.request = "hello";
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p, [&] { ++attempts; }), "pong hello");
  EXPECT_GE(attempts, 2);
  server.join();
}

TEST(ProbeWait, ConnectOnlyProbeReturnsEmptyReply) {
  int port = 0;
  UniqueFd l = bound_tcp_socket(port);
  ASSERT_EQ(::listen(l.get(), 8), 0);
  auto p = parse_probe("tcp:localhost:" + std::to_string(port));
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p), "");
  UniqueFd c(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(c);  // the probe really connected
}

TEST(ProbeWait, RetriesWhenTheServiceHangsUpBeforeAnswering) {
  auto dir = test::scratch_dir();
  const fs::path sock = dir.path() / "svc.sock";
  UniqueFd l = test::unix_listener(sock);
  std::thread server([&] {
    // Still loading: accept and hang up twice, then answer.
    for (int i = 0; i < 2; ++i) UniqueFd c(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
    serve_one(l.get());
  });
  auto p = parse_probe("unix:" + sock.string());
  p.request = "q";
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p), "pong q");
  server.join();
}

TEST(ProbeWait, TimesOutNamingTheTarget) {
  auto dir = test::scratch_dir();
  auto p = parse_probe("unix:" + (dir.path() / "never.sock").string());
  p.timeout = 200ms;
  const Error never = test::error_from([&] { wait_ready(p); });
  EXPECT_EQ(never.code(), Errc::kTimeout);
  EXPECT_NE(std::string(never.what()).find("never.sock"), std::string::npos) << never.what();

  int port = 0;
  UniqueFd refusing = bound_tcp_socket(port);
  auto t = parse_probe("tcp:127.0.0.1:" + std::to_string(port));
  t.timeout = 200ms;
  const Error e = test::error_from([&] { wait_ready(t); });
  EXPECT_EQ(e.code(), Errc::kTimeout);
  EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
}

TEST(ProbeWait, ServiceThatNeverRepliesTimesOut) {
  int port = 0;
  UniqueFd l = bound_tcp_socket(port);
  ASSERT_EQ(::listen(l.get(), 8), 0);  // the kernel accepts; nobody ever answers
  auto p = parse_probe("tcp:127.0.0.1:" + std::to_string(port));
  p.request = "ping";
  p.timeout = 300ms;
  const Error e = test::error_from([&] { wait_ready(p); });
  EXPECT_EQ(e.code(), Errc::kTimeout);
  EXPECT_NE(std::string(e.what()).find("no reply"), std::string::npos) << e.what();
}

TEST(ProbeWait, HookCanAbortTheWait) {
  auto dir = test::scratch_dir();
  auto p = parse_probe("unix:" + (dir.path() / "never.sock").string());
  p.timeout = 20s;
  int calls = 0;
  try {
    wait_ready(p, [&] {
      if (++calls == 3) throw Error(Errc::kProcess, "service exited");
    });
    FAIL() << "hook should abort";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
  }
  EXPECT_EQ(calls, 3);
}

TEST(ProbeWait, StdoutProbeNeedsAProcessWeStarted) {
  auto p = parse_probe("stdout:ready");
  const Error e = test::error_from([&] { wait_ready(p); });
  EXPECT_EQ(e.code(), Errc::kUsage);
  EXPECT_EQ(wait_ready(ReadinessProbe{}), "");  // kNone: nothing to wait for
}

TEST(ProbeStdout, FindsTheLineInARealChildsOutput) {
  SpawnOptions o;
  o.capture_stdout = true;
  Child c = spawn({"sh", "-c",
                   "echo loading weights; sleep 0.1; printf 'server READY on 9\\r\\n'; "
                   "sleep 0.1; echo after"},
                  o);
  EXPECT_EQ(wait_for_line(c.stdout_fd(), "READY", 20s), "server READY on 9");
  EXPECT_TRUE(c.wait().ok());
}

TEST(ProbeStdout, PartialLineWithoutNewlineMatches) {
  SpawnOptions o;
  o.capture_stdout = true;
  Child c = spawn({"sh", "-c", "printf 'prompt> '; exec sleep 5"}, o);
  EXPECT_EQ(wait_for_line(c.stdout_fd(), "prompt>", 20s), "prompt> ");
}

TEST(ProbeStdout, ExitBeforeTheLineIsAProcessError) {
  SpawnOptions o;
  o.capture_stdout = true;
  Child c = spawn({"sh", "-c", "echo crashed; exit 1"}, o);
  const Error e = test::error_from([&] { wait_for_line(c.stdout_fd(), "READY", 20s); });
  EXPECT_EQ(e.code(), Errc::kProcess);
  EXPECT_NE(std::string(e.what()).find("READY"), std::string::npos);
}

TEST(ProbeStdout, SilentChildTimesOut) {
  SpawnOptions o;
  o.capture_stdout = true;
  Child c = spawn({"sleep", "30"}, o);
  const Error e = test::error_from([&] { wait_for_line(c.stdout_fd(), "READY", 200ms); });
  EXPECT_EQ(e.code(), Errc::kTimeout);
}

TEST(ProbeWait, AbstractUnixSocket) {
  const std::string name = "gpuckpt-probe-test-" + std::to_string(::getpid());
  UniqueFd l(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path + 1, name.data(), name.size());  // leading NUL: abstract namespace
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&sa), len), 0);
  ASSERT_EQ(::listen(l.get(), 8), 0);
  std::thread server([&] { serve_one(l.get()); });
  auto p = parse_probe("unix:@" + name);
  p.request = "abs";
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p), "pong abs");
  server.join();
}

TEST(ProbeHttp, PollsUntilA2xxAndReturnsTheFirstBodyLine) {
  HttpServer server({http_answer("503 Service Unavailable", "loading\n"),
                     http_answer("503 Service Unavailable", "loading\n"),
                     http_answer("200 OK", "ok\nsecond line\n")});
  auto p = parse_probe(server.url("/health"));
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p), "ok");
  server.stop();
  ASSERT_EQ(server.requests().size(), 3u);
  const std::string& req = server.requests()[2];
  EXPECT_EQ(req.rfind("GET /health HTTP/1.1\r\n", 0), 0u) << req;
  EXPECT_NE(req.find("\r\nHost: 127.0.0.1:" + std::to_string(server.port()) + "\r\n"),
            std::string::npos)
      << req;
}

TEST(ProbeHttp, NotFoundIsRetriedUntilTheTimeout) {
  HttpServer server({http_answer("404 Not Found", "no such page\n")}, /*repeat=*/true);
  auto p = parse_probe(server.url("/missing"));
  p.timeout = 3s;  // long enough for the server thread to answer twice on a starved machine
  const Error e = test::error_from([&] { wait_ready(p); });
  EXPECT_EQ(e.code(), Errc::kTimeout);
  EXPECT_NE(std::string(e.what()).find("HTTP/1.1 404 Not Found"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find(server.url("/missing")), std::string::npos) << e.what();
  server.stop();
  EXPECT_GT(server.requests().size(), 1u) << "the probe polls";
}

TEST(ProbeHttp, RefusedConnectionsTimeOut) {
  int port = 0;
  UniqueFd refusing = bound_tcp_socket(port);
  auto p = parse_probe("http://127.0.0.1:" + std::to_string(port) + "/health");
  p.timeout = 200ms;
  const Error e = test::error_from([&] { wait_ready(p); });
  EXPECT_EQ(e.code(), Errc::kTimeout);
  EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
}

TEST(ProbeHttp, RequestIsPostedAsJson) {
  const std::string answer = R"({"choices":[{"text":" hi"}]})";
  HttpServer server({http_answer("200 OK", answer)});
  auto p = parse_probe(server.url("/v1/completions"));
  p.request = R"({"prompt": "x", "max_tokens": 1})";
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p), answer);  // no newline: the whole (Content-Length) body
  server.stop();
  ASSERT_EQ(server.requests().size(), 1u);
  const std::string& req = server.requests()[0];
  EXPECT_EQ(req.rfind("POST /v1/completions HTTP/1.1\r\n", 0), 0u) << req;
  EXPECT_NE(req.find("\r\nContent-Type: application/json\r\n"), std::string::npos) << req;
  EXPECT_NE(req.find("\r\nContent-Length: " + std::to_string(p.request.size()) + "\r\n"),
            std::string::npos);
  EXPECT_EQ(req.substr(req.size() - p.request.size()), p.request);
}

TEST(ProbeHttp, ChunkedEmptyAndNonHttpAnswers) {
  HttpServer server({"PONG\n",
                     "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                     "HTTP/1.1 204 No Content\r\n\r\n"});
  auto p = parse_probe(server.url("/"));
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p), "hello");  // after one failed attempt on "PONG"
  EXPECT_EQ(wait_ready(p), "HTTP/1.1 204 No Content");
  server.stop();
  EXPECT_EQ(server.requests().size(), 3u);

  HttpServer garbage({"PONG\n"}, /*repeat=*/true);
  auto g = parse_probe(garbage.url("/"));
  g.timeout = 3s;  // long enough for one attempt even under the sanitizers
  const Error e = test::error_from([&] { wait_ready(g); });
  EXPECT_EQ(e.code(), Errc::kTimeout);
  EXPECT_NE(std::string(e.what()).find("not an HTTP answer"), std::string::npos) << e.what();
}

TEST(ProbeHttp, ATimedOutProbeStillSaysWhatTheEarlierAttemptsGot) {
  // The deadline ends the last attempt while it waits: that alone would hide what the service
  // answered before it, which is what an operator needs to see.
  HttpServer server({"PONG\n", kHold}, /*repeat=*/true);
  auto p = parse_probe(server.url("/"));
  p.timeout = 3s;  // long enough for the server thread to answer PONG on a starved machine
  const Error e = test::error_from([&] { wait_ready(p); });
  EXPECT_EQ(e.code(), Errc::kTimeout);
  const std::string what = e.what();
  EXPECT_NE(what.find("last attempt: connected, but no HTTP answer in time"), std::string::npos)
      << what;
  EXPECT_NE(what.find("before that: not an HTTP answer: 'PONG'"), std::string::npos) << what;
}

TEST(ProbeHttp, AnswersOfTheVllmDemo) {
  auto dir = test::scratch_dir();
  auto demo = test::start_vllm_demo(dir.path(), {"--workers", "1", "--weights-mib", "1"});
  const std::string base = "http://127.0.0.1:" + std::to_string(demo.port);
  auto health = parse_probe(base + "/health");
  health.timeout = 20s;
  EXPECT_EQ(wait_ready(health), "ok");
  auto complete = parse_probe(base + "/v1/completions");
  complete.request = R"({"prompt": "probe me", "max_tokens": 3, "session": "probe"})";
  complete.timeout = 20s;
  const auto j = nlohmann::json::parse(wait_ready(complete));
  EXPECT_EQ(j["choices"][0]["text"], test::vllm_complete(demo.port, "again", "probe me", 3));
  auto missing = parse_probe(base + "/v2/none");
  missing.timeout = 200ms;
  EXPECT_THROW(wait_ready(missing), Error);
}
