// Readiness probe against real unix and TCP listeners that come up late, a real child's
// stdout, timeouts and malformed specs.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
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

TEST(ProbeParse, RejectsBadSpecsAsUsageErrors) {
  for (const std::string& bad : std::vector<std::string>{
           "", "unix", "unix:", "tcp:", "tcp:host", "tcp::80", "tcp:host:", "tcp:host:0",
           "tcp:host:65536", "tcp:host:8o", "tcp:host:123456", "stdout:", "http://x:80", "udp:x:1",
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

TEST(ProbeWait, UnixListenerThatStartsLateAnswersTheRequest) {
  auto dir = test::scratch_dir();
  const fs::path sock = dir.path() / "svc.sock";
  std::thread server([&] {
    std::this_thread::sleep_for(150ms);
    UniqueFd l = unix_listener(sock);
    serve_one(l.get());
  });
  ASSERT_FALSE(fs::exists(sock));  // so the probe must poll
  auto p = parse_probe("unix:" + sock.string());
  p.request = "ping";
  p.timeout = 20s;
  EXPECT_EQ(wait_ready(p), "pong ping");
  server.join();
}

TEST(ProbeWait, TcpListenerThatStartsLateAnswersTheRequest) {
  int port = 0;
  UniqueFd l = bound_tcp_socket(port);
  std::atomic<bool> listening{false};
  std::thread server([&] {
    std::this_thread::sleep_for(150ms);
    ::listen(l.get(), 8);
    listening = true;
    serve_one(l.get());
  });
  auto p = parse_probe("tcp:127.0.0.1:" + std::to_string(port));
  p.request = "hello";
  p.timeout = 20s;
  EXPECT_FALSE(listening.load());
  EXPECT_EQ(wait_ready(p), "pong hello");
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
  UniqueFd l = unix_listener(sock);
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
  try {
    wait_ready(p);
    FAIL() << "should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
    EXPECT_NE(std::string(e.what()).find("never.sock"), std::string::npos) << e.what();
  }

  int port = 0;
  UniqueFd refusing = bound_tcp_socket(port);
  auto t = parse_probe("tcp:127.0.0.1:" + std::to_string(port));
  t.timeout = 200ms;
  try {
    wait_ready(t);
    FAIL() << "should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
}

TEST(ProbeWait, ServiceThatNeverRepliesTimesOut) {
  int port = 0;
  UniqueFd l = bound_tcp_socket(port);
  ASSERT_EQ(::listen(l.get(), 8), 0);  // the kernel accepts; nobody ever answers
  auto p = parse_probe("tcp:127.0.0.1:" + std::to_string(port));
  p.request = "ping";
  p.timeout = 300ms;
  try {
    wait_ready(p);
    FAIL() << "should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
    EXPECT_NE(std::string(e.what()).find("no reply"), std::string::npos) << e.what();
  }
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
  try {
    wait_ready(p);
    FAIL() << "stdout probe without a pipe must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
  }
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
  try {
    wait_for_line(c.stdout_fd(), "READY", 20s);
    FAIL() << "should fail on EOF";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
    EXPECT_NE(std::string(e.what()).find("READY"), std::string::npos);
  }
}

TEST(ProbeStdout, SilentChildTimesOut) {
  SpawnOptions o;
  o.capture_stdout = true;
  Child c = spawn({"sleep", "30"}, o);
  try {
    wait_for_line(c.stdout_fd(), "READY", 200ms);
    FAIL() << "should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
  }
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
