// End to end, through the CLI, with real CRIU and servers that this project did not write (from
// Debian's packages: python3's http.server, nginx, redis) as well as process trees, TCP
// connections and the vLLM-shaped demo. Each service is verified with its own client after a
// dump+restore and a migration. These tests FAIL (not skip) when a server is missing:
// scripts/setup.sh installs them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/io_uring.h>
#include <atomic>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "criu/criu.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

struct Cli {
  int code = -1;
  std::string out, err;
  json j;
};

Cli cli(const std::vector<std::string>& args, int timeout_s = 300) {
  const auto r = test::run_cli(args, timeout_s);
  return {r.exit_code, r.out, r.err, json::parse(r.out, nullptr, false)};
}

std::string cat(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec) ? read_file(p) : std::string();
}

// A service in its own session (no terminal: CRIU dumps it without --shell-job), stdin from
// /dev/null and its output in files of `dir` (CRIU reopens them on restore).
Child start_service(const std::vector<std::string>& argv, const fs::path& dir,
                    const std::string& name, const fs::path& cwd = {}) {
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir / (name + ".out");
  o.stderr_file = dir / (name + ".err");
  o.cwd = cwd.empty() ? dir : cwd;
  return spawn(argv, o);
}

// A server just resumed or restored may not have run yet: the kernel holds the connection until
// it does, so the answer is waited for rather than expected within a scheduling slice.
bool http_ok(int port, const std::string& path = "/") {
  try {
    return test::http_request(port, "GET", path, {}, 20s).status == 200;
  } catch (const Error&) {
    return false;
  }
}

std::string http_body(int port, const std::string& path) {
  const auto r = test::http_request(port, "GET", path, {}, 30s);
  EXPECT_EQ(r.status, 200) << "GET " << path;
  return r.body;
}

// No process of `pids` exists any more or is a zombie; in particular none is left stopped.
bool all_gone(const std::vector<pid_t>& pids) {
  return test::wait_until([&] {
    for (pid_t p : pids) {
      const char s = test::process_state(p);
      if (s != 0 && s != 'Z' && s != 'X') return false;
    }
    return true;
  });
}

bool none_stopped(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (test::process_state(p) == 'T') return false;
  return true;
}

void end_all(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) ::kill(p, SIGKILL);
  for (pid_t p : pids) process::wait_ended(p, 10s);
}

std::vector<pid_t> json_pids(const json& j) {
  return j.is_array() ? j.get<std::vector<pid_t>>() : std::vector<pid_t>{};
}

class E2eServers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { test::close_inherited_fds(); }
  void SetUp() override {
    try {
      criu::locate();
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    dir_ = test::scratch_dir("gpuckpt-e2e-srv");
  }
  fs::path path(const std::string& name) const { return dir_.path() / name; }
  TempDir dir_;
};

}  // namespace

// The acceptance case of the "real serving processes" issue: python3 -m http.server on TCP.
TEST_F(E2eServers, PythonHttpServerComesBackOnItsTcpPortAfterDumpRestoreAndMigrate) {
  const fs::path www = path("www");
  fs::create_directory(www);
  { std::ofstream(www / "hello.txt") << "hello from a checkpointed server\n"; }
  const int port = test::free_tcp_port();
  Child srv = start_service({"python3", "-m", "http.server", std::to_string(port), "--bind",
                             "127.0.0.1", "--directory", www.string()},
                            dir_.path(), "http");
  ASSERT_TRUE(test::wait_until([&] { return http_ok(port, "/hello.txt"); }))
      << cat(path("http.err"));
  const std::string body = http_body(port, "/hello.txt");
  const pid_t pid = srv.pid();

  Cli d = cli({"--json", "dump", "--pid", std::to_string(pid), "-o", path("http.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.j["tree"], json::array({pid}));
  EXPECT_EQ(d.j["tcp_established"], false);
  auto st = srv.wait_for(10s);
  ASSERT_TRUE(st.has_value()) << "the dumped server still runs";
  EXPECT_FALSE(http_ok(port)) << "the port still answers after the dump";

  Cli r = cli({"--json", "restore", path("http.ckpt").string(), "--probe",
               "tcp:127.0.0.1:" + std::to_string(port)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.j["pid"], pid);
  EXPECT_EQ(http_body(port, "/hello.txt"), body);

  // Same-host migration of a TCP listener: the port passes from the original to the copy.
  Cli m = cli({"--json", "migrate", "--pid", std::to_string(pid), "--to", path("mig").string(),
               "--probe", "http://127.0.0.1:" + std::to_string(port) + "/hello.txt"});
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(m.j["handoff"], "release");
  const pid_t moved = m.j["pid"].get<pid_t>();
  EXPECT_EQ(http_body(port, "/hello.txt"), body);
  // Restored in place, in our pid namespace: it can be checkpointed again (a snapshot here).
  Cli snap = cli({"--json", "dump", "--pid", std::to_string(moved), "-o",
                  path("snap.ckpt").string(), "--leave-running"});
  ASSERT_EQ(snap.code, 0) << snap.err;
  EXPECT_EQ(http_body(port, "/hello.txt"), body);
  end_all({moved});
}

// A process tree (a shell that started two servers) is one unit: all frozen and dumped, all
// ended, all restored.
TEST_F(E2eServers, TreeDumpEndsEveryProcessAndRestoreBringsTheWholeTreeBack) {
  const int p1 = test::free_tcp_port(), p2 = test::free_tcp_port();
  const std::string server =
      "python3 -m http.server --bind 127.0.0.1 --directory " + dir_.path().string() + " ";
  Child sh = start_service({"bash", "-c",
                            server + std::to_string(p1) + " >a.log 2>&1 & " + server +
                                std::to_string(p2) + " >b.log 2>&1 & wait"},
                           dir_.path(), "tree");
  ASSERT_TRUE(test::wait_until([&] { return http_ok(p1) && http_ok(p2); }));
  const auto before = process::process_tree(sh.pid());
  ASSERT_EQ(before.size(), 3u);

  Cli d =
      cli({"--json", "dump", "--pid", std::to_string(sh.pid()), "-o", path("tree.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  const auto tree = json_pids(d.j["tree"]);
  EXPECT_EQ(tree.size(), 3u) << d.out;
  // Every process of the tree ended: none is left stopped behind.
  EXPECT_TRUE(all_gone(before));
  sh.wait_for(10s);

  Cli r = cli({"--json", "restore", path("tree.ckpt").string(), "--probe",
               "tcp:127.0.0.1:" + std::to_string(p2)});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto restored = json_pids(r.j["tree"]);
  EXPECT_EQ(std::set<pid_t>(restored.begin(), restored.end()),
            std::set<pid_t>(tree.begin(), tree.end()));
  EXPECT_TRUE(http_ok(p1));
  EXPECT_TRUE(http_ok(p2));
  end_all(restored);
}

// `bench restore --runs 2` restores the same pids twice, so the first copy, its children
// included, must be gone before the second. Each copy is stopped as an operator would: its
// shell's SIGTERM trap runs, and its server, which ignores SIGTERM, is killed after the grace.
TEST_F(E2eServers, BenchRestoreStopsTheWholeRestoredTreeGracefullyBeforeItsNextRun) {
  const int port = test::free_tcp_port();
  write_file_atomic(
      path("server.py"),
      "import functools, http.server, signal, sys\n"
      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
      "h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])\n"
      "http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), h)"
      ".serve_forever()\n");
  Child sh = start_service(
      {"bash", "-c",
       "trap 'echo stopped >>stopped.txt; exit 0' TERM; python3 server.py " + std::to_string(port) +
           " " + dir_.path().string() + " >srv.log 2>&1 & wait"},
      dir_.path(), "tree");
  ASSERT_TRUE(test::wait_until([&] { return http_ok(port); }));
  Cli d =
      cli({"--json", "dump", "--pid", std::to_string(sh.pid()), "-o", path("tree.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  const auto tree = json_pids(d.j["tree"]);
  ASSERT_EQ(tree.size(), 2u) << d.out;
  sh.wait_for(10s);
  ASSERT_EQ(cat(path("stopped.txt")), "");  // the dump's SIGKILL runs no trap

  Cli b = cli({"--json", "bench", "restore", path("tree.ckpt").string(), "--runs", "2", "--probe",
               "tcp:127.0.0.1:" + std::to_string(port), "--stop-timeout", "3"});
  EXPECT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(cat(path("stopped.txt")), "stopped\nstopped\n") << b.err;
  EXPECT_TRUE(all_gone(tree));

  // In a pid namespace of its own, the same: the trap runs, and nothing is left to fail.
  Cli n = cli({"--json", "bench", "restore", path("tree.ckpt").string(), "--new-pidns", "--probe",
               "tcp:127.0.0.1:" + std::to_string(port), "--stop-timeout", "3"});
  EXPECT_EQ(n.code, 0) << n.err;
  EXPECT_EQ(cat(path("stopped.txt")), "stopped\nstopped\nstopped\n") << n.err;
  EXPECT_FALSE(http_ok(port));
  end_all(tree);
}

TEST_F(E2eServers, FailedTreeDumpResumesEveryProcessOfTheTree) {
  const int p1 = test::free_tcp_port();
  Child sh = start_service(
      {"bash", "-c",
       "python3 -m http.server --bind 127.0.0.1 " + std::to_string(p1) + " >a.log 2>&1 & wait"},
      dir_.path(), "tree");
  ASSERT_TRUE(test::wait_until([&] { return http_ok(p1); }));
  const auto tree = process::process_tree(sh.pid());
  // CRIU's dump succeeds (the tree is then stopped), but the checkpoint cannot be written.
  Cli d = cli({"dump", "--pid", std::to_string(sh.pid()), "-o", "/proc/gpuckpt-e2e.ckpt"});
  EXPECT_NE(d.code, 0);
  EXPECT_NE(d.err.find("no checkpoint was written"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("resumed"), std::string::npos) << d.err;
  EXPECT_TRUE(none_stopped(tree));
  EXPECT_TRUE(http_ok(p1));
  end_all(process::process_tree(sh.pid()));
}

TEST_F(E2eServers, TreeHoldingAZombieIsDumpedAndRestoredWithItsZombie) {
  // The parent never reaps its child: the tree holds a zombie, which CRIU dumps as such.
  // "python3" may be a launcher script (pyenv's shim is bash) whose own short-lived children
  // are zombies for a moment: the service names its zombie in a file once it is the service.
  const fs::path sock = path("z.sock"), named = path("z.child");
  Child z = start_service({"python3", "-c",
                           "import os, socket, select, sys\n"
                           "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4)\n"
                           "pid = os.fork()\n"
                           "if pid == 0: os._exit(7)\n"
                           "open(sys.argv[2] + '.tmp', 'w').write(str(pid))\n"
                           "os.rename(sys.argv[2] + '.tmp', sys.argv[2])\n"
                           "while True:\n"
                           "    c, _ = s.accept()\n"
                           // A probe that hangs up before the answer must not end the service.
                           "    try: c.sendall(b'alive\\n')\n"
                           "    except OSError: pass\n"
                           "    c.close()\n",
                           sock.string(), named.string()},
                          dir_.path(), "zombie");
  pid_t child = 0;
  ASSERT_TRUE(test::wait_until([&] {
    const std::string s = cat(named);
    child = s.empty() ? 0 : std::stoi(s);
    const auto t = process::process_tree(z.pid());
    return child && test::process_state(child) == 'Z' &&
           std::find(t.begin(), t.end(), child) != t.end();
  })) << cat(path("zombie.err"));
  Cli d = cli({"--json", "dump", "--pid", std::to_string(z.pid()), "-o", path("z.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  z.wait_for(10s);
  Cli r = cli({"--json", "restore", path("z.ckpt").string(), "--probe", "unix:" + sock.string()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(test::process_state(child), 'Z') << "the zombie did not come back";
  const auto tree = process::process_tree(r.j["pid"].get<pid_t>());
  EXPECT_NE(std::find(tree.begin(), tree.end(), child), tree.end())
      << "the zombie is not its parent's child again";
  end_all({r.j["pid"].get<pid_t>()});
}

TEST_F(E2eServers, ChildThatExitsDuringTheDumpDoesNotBreakIt) {
  // The shell forks short-lived children all the time: some exist when the tree is scanned
  // and are gone before it is frozen, others are frozen mid-life and exit after the restore.
  Child sh = start_service({"bash", "-c",
                            "i=0; while :; do /bin/sleep 0.005; i=$((i+1)); echo $i >count.tmp; "
                            "mv count.tmp count; done"},
                           dir_.path(), "churn");
  auto count = [&] {
    const std::string s = cat(path("count"));
    return s.empty() ? 0 : std::stoi(s);
  };
  ASSERT_TRUE(test::wait_until([&] { return count() > 5; }));
  Cli d = cli({"--json", "dump", "--pid", std::to_string(sh.pid()), "-o", path("c.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_TRUE(all_gone(json_pids(d.j["tree"])));
  sh.wait_for(10s);
  const int at_dump = count();
  Cli r = cli({"--json", "restore", path("c.ckpt").string()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(test::wait_until([&] { return count() > at_dump + 5; }))
      << "the restored shell does not go on";
  end_all(process::process_tree(r.j["pid"].get<pid_t>()));
}

TEST_F(E2eServers, ProcessUsingIoUringIsRefusedBeforeAnythingIsFrozen) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    io_uring_params p{};
    const long fd = ::syscall(__NR_io_uring_setup, 4, &p);
    (void)!::write(ready[1], fd >= 0 ? "y" : "n", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_EQ(c, 'y') << "io_uring_setup failed in the test process";
  std::atomic<bool> stop{false}, stopped{false};
  std::thread watch([&] {
    while (!stop) {
      if (test::process_state(pid) == 'T') stopped = true;
      std::this_thread::sleep_for(1ms);
    }
  });
  Cli d = cli({"dump", "--pid", std::to_string(pid), "-o", path("u.ckpt").string()});
  stop = true;
  watch.join();
  EXPECT_EQ(d.code, 10) << d.err;
  EXPECT_NE(d.err.find("io_uring"), std::string::npos) << d.err;
  EXPECT_FALSE(stopped) << "the process was frozen before the refusal";
  EXPECT_FALSE(fs::exists(path("u.ckpt")));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST_F(E2eServers, KernelThreadIsRefusedInThePreflight) {
  Cli d = cli({"dump", "--pid", "2", "-o", path("k.ckpt").string()});
  EXPECT_EQ(d.code, 10) << d.err;
  EXPECT_NE(d.err.find("kernel thread"), std::string::npos) << d.err;
}

// Established TCP connections: by default they are not dumped and the client sees its
// connection closed; with --tcp-established the client's connection survives the restore.
TEST_F(E2eServers, TcpEstablishedKeepsAClientConnectedAndTheDefaultClosesIt) {
  const char* kEcho =
      "import socket, sys, os, select\n"
      "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
      "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8); conns = []; n = 0\n"
      "while True:\n"
      "    for x in select.select([s] + conns, [], [])[0]:\n"
      "        if x is s: conns.append(s.accept()[0]); continue\n"
      "        d = x.recv(100)\n"
      "        if not d: conns.remove(x); x.close(); continue\n"
      "        n += 1; x.sendall(b'%d\\n' % n)\n";
  for (const bool established : {true, false}) {
    SCOPED_TRACE(established ? "--tcp-established" : "default");
    const int port = test::free_tcp_port();
    Child srv = start_service({"python3", "-c", kEcho, std::to_string(port)}, dir_.path(),
                              established ? "est" : "close");
    UniqueFd c;
    ASSERT_TRUE(test::wait_until([&] {
      c = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(static_cast<std::uint16_t>(port));
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return ::connect(c.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    }));
    timeval tv{30, 0};
    ::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    auto ask = [&]() -> std::string {
      if (::send(c.get(), "x", 1, MSG_NOSIGNAL) != 1) return "send failed";
      char buf[64];
      const ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
      return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "closed";
    };
    ASSERT_EQ(ask(), "1\n");
    const fs::path ckpt = path(established ? "est.ckpt" : "close.ckpt");
    std::vector<std::string> args{"--json", "dump",       "--pid", std::to_string(srv.pid()),
                                  "-o",     ckpt.string()};
    if (established) args.push_back("--tcp-established");
    Cli d = cli(args);
    ASSERT_EQ(d.code, 0) << d.err;
    EXPECT_EQ(d.j["tcp_established"], established);
    srv.wait_for(10s);
    Cli r = cli({"--json", "restore", ckpt.string()});
    ASSERT_EQ(r.code, 0) << r.err;
    if (established)
      EXPECT_EQ(ask(), "2\n") << "the client's connection did not survive";
    else
      EXPECT_EQ(ask(), "closed") << "a connection that was not dumped still answers";
    end_all({r.j["pid"].get<pid_t>()});
  }
}

// nginx from Debian: a master and two worker processes sharing memory and a TCP listener.
TEST_F(E2eServers, NginxMasterAndWorkersSurviveDumpRestoreAndMigrate) {
  ASSERT_TRUE(fs::exists("/usr/sbin/nginx")) << "nginx is missing: run scripts/setup.sh";
  const int port = test::free_tcp_port();
  fs::create_directories(path("html"));
  { std::ofstream(path("html") / "index.html") << "<h1>nginx under gpuckpt</h1>\n"; }
  const fs::path d = dir_.path();
  // Workers run as root: this sandbox lacks CAP_SYS_RESOURCE, which CRIU needs to read the
  // rlimits of a process of another user (docs/PROCESS.md, "Limits").
  std::ofstream(path("nginx.conf"))
      << "user root;\nworker_processes 2;\ndaemon off;\npid " << (d / "nginx.pid").string()
      << ";\nerror_log " << (d / "error.log").string() << ";\n"
      << "events { worker_connections 64; }\nhttp {\n  access_log off;\n"
      << "  client_body_temp_path " << (d / "body").string() << ";\n  proxy_temp_path "
      << (d / "proxy").string() << ";\n  fastcgi_temp_path " << (d / "fcgi").string()
      << ";\n  uwsgi_temp_path " << (d / "uwsgi").string() << ";\n  scgi_temp_path "
      << (d / "scgi").string() << ";\n  server { listen 127.0.0.1:" << port << "; root "
      << (d / "html").string() << "; }\n}\n";
  Child ngx = start_service({"/usr/sbin/nginx", "-e", (d / "error.log").string(), "-c",
                             path("nginx.conf").string(), "-p", d.string()},
                            d, "nginx");
  ASSERT_TRUE(test::wait_until([&] {
    return http_ok(port) && process::process_tree(ngx.pid()).size() == 3;
  })) << cat(path("error.log"));
  const std::string page = http_body(port, "/index.html");

  Cli dump =
      cli({"--json", "dump", "--pid", std::to_string(ngx.pid()), "-o", path("n.ckpt").string()});
  ASSERT_EQ(dump.code, 0) << dump.err;
  EXPECT_EQ(json_pids(dump.j["tree"]).size(), 3u);
  EXPECT_TRUE(all_gone(json_pids(dump.j["tree"])));
  ngx.wait_for(10s);
  Cli r = cli({"--json", "restore", path("n.ckpt").string(), "--probe",
               "http://127.0.0.1:" + std::to_string(port) + "/index.html"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json_pids(r.j["tree"]).size(), 3u);
  EXPECT_EQ(http_body(port, "/index.html"), page);

  Cli m = cli({"--json", "migrate", "--pid", std::to_string(r.j["pid"].get<pid_t>()), "--to",
               path("mig").string(), "--probe",
               "http://127.0.0.1:" + std::to_string(port) + "/index.html"});
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(m.j["handoff"], "release");
  EXPECT_EQ(http_body(port, "/index.html"), page);
  end_all(process::process_tree(m.j["pid"].get<pid_t>()));
}

// redis from Debian, holding a data set in memory: verified with redis-cli's DEBUG DIGEST (a
// hash of the whole data set) after each move.
TEST_F(E2eServers, RedisDataSetIsIntactAfterDumpRestoreAndMigrate) {
  ASSERT_TRUE(fs::exists("/usr/bin/redis-server")) << "redis is missing: run scripts/setup.sh";
  const int port = test::free_tcp_port();
  const std::string p = std::to_string(port);
  Child rs = start_service(
      {"/usr/bin/redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly",
       "no", "--enable-debug-command", "yes", "--dir", dir_.path().string()},
      dir_.path(), "redis");
  auto redis = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv{"/usr/bin/redis-cli", "-p", p};
    argv.insert(argv.end(), args.begin(), args.end());
    auto res = run_capture(argv, 60s);
    std::string out = res.output;
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
  };
  ASSERT_TRUE(test::wait_until([&] { return redis({"PING"}) == "PONG"; }));
  // 64 MiB of values: 65536 keys of 1 KiB.
  ASSERT_EQ(redis({"DEBUG", "POPULATE", "65536", "key", "1024"}), "OK");
  ASSERT_EQ(redis({"SET", "session:42", "kv-cache-of-a-conversation"}), "OK");
  const std::string digest = redis({"DEBUG", "DIGEST"});
  ASSERT_EQ(redis({"DBSIZE"}), "65537");

  Cli d = cli({"--json", "dump", "--pid", std::to_string(rs.pid()), "-o", path("r.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  rs.wait_for(10s);
  Cli r = cli({"--json", "restore", path("r.ckpt").string(), "--probe", "tcp:127.0.0.1:" + p,
               "--request", "PING"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(redis({"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(redis({"GET", "session:42"}), "kv-cache-of-a-conversation");

  Cli m = cli({"--json", "migrate", "--pid", std::to_string(r.j["pid"].get<pid_t>()), "--to",
               path("mig").string(), "--probe", "tcp:127.0.0.1:" + p});
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(redis({"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(redis({"DBSIZE"}), "65537");
  end_all({m.j["pid"].get<pid_t>()});
}

// The vLLM-shaped demo: HTTP front on TCP, engine and workers joined by a /dev/shm ring and unix
// sockets. A conversation continues after dump+restore, after a migration and from a snapshot
// exactly as an uninterrupted run does.
TEST_F(E2eServers, VllmShapedDemoContinuesTheConversationAfterDumpRestoreMigrateAndSnapshot) {
  const std::vector<std::string> prompts{"Hello", "What is CRIU?", "And CUDA?", "Thanks", "Bye"};
  const std::vector<std::string> args{"--workers", "2", "--weights-mib", "8"};
  std::vector<std::string> expected;
  {
    const fs::path ref_dir = path("ref");
    fs::create_directory(ref_dir);
    auto ref = test::start_vllm_demo(ref_dir, args);
    for (const auto& q : prompts) expected.push_back(test::vllm_complete(ref.port, "s1", q));
    ref.front.kill(SIGTERM);
    ref.front.wait_for(30s);
  }
  auto demo = test::start_vllm_demo(dir_.path(), args);
  const int port = demo.port;
  const pid_t root = demo.front.pid();
  EXPECT_EQ(test::vllm_complete(port, "s1", prompts[0]), expected[0]);
  EXPECT_EQ(test::vllm_complete(port, "s1", prompts[1]), expected[1]);
  const auto tree = process::process_tree(root);
  ASSERT_EQ(tree.size(), 4u);  // front, engine, 2 workers

  Cli d = cli({"--json", "dump", "--pid", std::to_string(root), "-o", path("v.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(json_pids(d.j["tree"]).size(), 4u);
  EXPECT_TRUE(all_gone(tree));
  demo.front.wait_for(10s);
  const std::string health = "http://127.0.0.1:" + std::to_string(port) + "/health";
  Cli r = cli({"--json", "restore", path("v.ckpt").string(), "--probe", health});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(test::vllm_complete(port, "s1", prompts[2]), expected[2]);

  Cli m = cli({"--json", "migrate", "--pid", std::to_string(root), "--to", path("mig").string(),
               "--probe", health});
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(m.j["handoff"], "release");
  EXPECT_EQ(test::vllm_complete(port, "s1", prompts[3]), expected[3]);

  Cli s = cli({"--json", "dump", "--pid", std::to_string(root), "-o", path("snap.ckpt").string(),
               "--leave-running"});
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(test::vllm_complete(port, "s1", prompts[4]), expected[4]);
  end_all(process::process_tree(root));
}

// What real servers use to share state: a /dev/shm segment unlinked once mapped (a CRIU "ghost"
// file, here 4 MiB, above CRIU's default 1 MiB limit), a memfd and an eventfd, shared by a parent
// and its child. Their contents come back byte for byte.
TEST_F(E2eServers, UnlinkedShmSegmentMemfdAndEventfdComeBackIntact) {
  const fs::path sock = path("shm.sock");
  Child p = start_service(
      {"python3", "-c",
       "import os, mmap, socket, sys, hashlib\n"
       "name = '/dev/shm/gpuckpt-e2e-%d' % os.getpid()\n"
       "fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600); os.ftruncate(fd, 4 << 20)\n"
       "ring = mmap.mmap(fd, 4 << 20); os.unlink(name)\n"
       "for i in range(0, 4 << 20, 4096): ring[i:i + 8] = (i * 2654435761 % (1 << 64)).to_bytes(8, "
       "'little')\n"
       "mfd = os.memfd_create('kv'); os.write(mfd, b'kv-state-' * 1000)\n"
       "efd = os.eventfd(41)\n"
       "if os.fork() == 0:\n"
       "    import select; select.select([], [], [])\n"
       "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4)\n"
       "while True:\n"
       "    c, _ = s.accept()\n"
       "    os.eventfd_write(efd, 1); v = os.eventfd_read(efd); os.eventfd_write(efd, v - 1)\n"
       "    h = hashlib.sha256(ring[:] + os.pread(mfd, 1 << 20, 0)).hexdigest()\n"
       "    try: c.sendall(('%s %d\\n' % (h, v)).encode())\n"
       "    except OSError: pass  # a probe that only connects\n"
       "    c.close()\n",
       sock.string()},
      dir_.path(), "shm");
  auto ask_sum = [&]() -> std::string {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, sock.c_str(), sizeof a.sun_path - 1);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
    std::string out;
    char c;
    while (::recv(fd.get(), &c, 1, 0) == 1 && c != '\n') out += c;
    return out;
  };
  std::string before;
  ASSERT_TRUE(test::wait_until([&] { return !(before = ask_sum()).empty(); }))
      << cat(path("shm.err"));
  EXPECT_NE(before.find(" 42"), std::string::npos) << before;
  ASSERT_TRUE(test::wait_until([&] { return process::process_tree(p.pid()).size() == 2; }));
  Cli d =
      cli({"--json", "dump", "--pid", std::to_string(p.pid()), "-o", path("shm.ckpt").string()});
  ASSERT_EQ(d.code, 0) << d.err;
  p.wait_for(10s);
  Cli r = cli({"--json", "restore", path("shm.ckpt").string(), "--probe", "unix:" + sock.string()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ask_sum(), before) << "shared state changed across the checkpoint";
  end_all(json_pids(r.j["tree"]));
}
