#include "util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "gpuckpt/error.h"
#include "util/no_sigpipe.h"
#include "util/poll_timeout.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

extern char** environ;

namespace gpuckpt {

std::string ExitStatus::describe() const {
  return exited ? "exit code " + std::to_string(code)
                : "killed by signal " + std::to_string(code) + " (" + strsignal(code) + ")";
}

namespace {
ExitStatus decode(int status) {
  if (WIFEXITED(status)) return {true, WEXITSTATUS(status)};
  return {false, WIFSIGNALED(status) ? WTERMSIG(status) : -1};
}

// In the child: `fd` becomes `target` for the program. dup2 of a descriptor onto itself leaves
// its close-on-exec flag set, and the program would start without it (a pipe opened while
// gpuckpt's own stdin was closed lands on 0): that flag is cleared instead.
bool onto(int fd, int target) {
  if (fd != target) return ::dup2(fd, target) >= 0;
  const int flags = ::fcntl(fd, F_GETFD);
  return flags >= 0 && ::fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) >= 0;
}
}  // namespace

Child::Child(Child&& o) noexcept : pid_(std::exchange(o.pid_, -1)), out_(std::move(o.out_)) {}

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = std::exchange(o.pid_, -1);
    out_ = std::move(o.out_);
  }
  return *this;
}

Child::~Child() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

namespace {

// waitpid(-1) would reap whichever child ends next, and so take another Child's status: that
// one's wait() then fails (ECHILD), or, once its pid is reused, waits on a stranger.
void require_running(pid_t pid) {
  if (pid <= 0) throw Error(Errc::kInternal, "wait on a child process that was already reaped");
}

}  // namespace

ExitStatus Child::wait() {
  require_running(pid_);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) throw_errno(Errc::kInternal, "waitpid");
  }
  pid_ = -1;
  return decode(status);
}

std::optional<ExitStatus> Child::wait_for(std::chrono::milliseconds timeout) {
  require_running(pid_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Woken by the child's pidfd the moment it exits: criu's exit is on the path of every dump
  // and restore, and polling with a backoff added up to its last sleep (20 ms) to each. The
  // pid is ours and not yet reaped, so it names this child. Without pidfds (kernels before
  // 5.3), the backoff.
  const UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  auto sleep = std::chrono::microseconds(200);
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return decode(status);
    }
    if (r < 0 && errno != EINTR) throw_errno(Errc::kInternal, "waitpid");
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    if (pidfd) {
      pollfd pfd{pidfd.get(), POLLIN, 0};
      if (::poll(&pfd, 1, std::max(poll_timeout_ms(deadline), 1)) < 0 && errno != EINTR)
        throw_errno(Errc::kInternal, "poll on a child's pidfd");
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }
}

void Child::kill(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

pid_t Child::release() {
  return std::exchange(pid_, -1);
}

std::vector<std::string> environment_with(const std::vector<std::string>& overrides) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  for (const auto& kv : overrides) {
    const auto entry = split_env_entry(kv);
    if (!entry) continue;  // no KEY=VALUE: it would match every entry, and set none
    const std::string key = entry->first + "=";
    std::erase_if(envs, [&](const std::string& s) { return s.rfind(key, 0) == 0; });
    envs.push_back(kv);
  }
  return envs;
}

std::optional<std::pair<std::string, std::string>> split_env_entry(const std::string& kv) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos) return std::nullopt;
  return std::pair{kv.substr(0, eq), kv.substr(eq + 1)};
}

Child spawn(const std::vector<std::string>& argv, const SpawnOptions& opts) {
  if (argv.empty()) throw Error(Errc::kInternal, "spawn: empty argv");
  // Everything the child needs is prepared before fork(): after it only async-signal-safe calls.
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::string> envs = environment_with(opts.env);
  std::vector<char*> cenv;
  for (auto& s : envs) cenv.push_back(s.data());
  cenv.push_back(nullptr);

  int outpipe[2] = {-1, -1};
  int errpipe[2] = {-1, -1};  // reports exec failure to the parent
  int gate[2] = {-1, -1};     // opts.before_exec: one byte from the parent lets the child exec
  auto close_all = [&] {
    for (int* p : {outpipe, errpipe, gate})
      for (int i : {0, 1})
        if (p[i] >= 0) ::close(std::exchange(p[i], -1));
  };
  if ((opts.capture_stdout && ::pipe2(outpipe, O_CLOEXEC) != 0) ||
      ::pipe2(errpipe, O_CLOEXEC) != 0 || (opts.before_exec && ::pipe2(gate, O_CLOEXEC) != 0)) {
    const int err = errno;
    close_all();
    throw_syserr(Errc::kInternal, err, "pipe");
  }

  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    close_all();
    throw_syserr(Errc::kInternal, err, "fork");
  }
  if (pid == 0) {
    ::close(errpipe[0]);
    if (gate[1] >= 0) {
      // Our copy of the write end closed, EOF means the parent gave up or died: run nothing.
      ::close(gate[1]);
      char go = 0;
      ssize_t g;
      do {
        g = ::read(gate[0], &go, 1);
      } while (g < 0 && errno == EINTR);
      if (g != 1) ::_exit(127);
    }
    // gpuckpt's CLI blocks the termination signals in every thread and waits for them in one;
    // a child must start with the default mask and dispositions again.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
    if (opts.new_session) ::setsid();
    if (opts.new_process_group && !opts.new_session) ::setpgid(0, 0);
    // Checked after the prctl: a parent that died before it would never signal.
    if (opts.die_with_parent && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent))
      ::_exit(127);
    for (const int fd : opts.namespace_fds)
      if (::setns(fd, 0) != 0) {
        // The parent names the namespace, not the program: errno alone would blame the latter.
        int why[2] = {errno, fd};
        (void)!::write(errpipe[1], why, sizeof why);
        ::_exit(127);
      }
    if (!opts.cwd.empty() && ::chdir(opts.cwd.c_str()) != 0) goto fail;
    if (opts.stdin_fd >= 0) {
      if (!onto(opts.stdin_fd, 0)) goto fail;
    } else if (opts.null_stdin) {
      int fd = ::open("/dev/null", O_RDONLY);
      if (fd < 0 || ::dup2(fd, 0) < 0) goto fail;
    }
    if (opts.stdout_fd >= 0) {
      if (!onto(opts.stdout_fd, 1)) goto fail;
    } else if (opts.capture_stdout) {
      if (::dup2(outpipe[1], 1) < 0) goto fail;
    } else if (!opts.stdout_file.empty()) {
      int fd = ::open(opts.stdout_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0 || ::dup2(fd, 1) < 0) goto fail;
    }
    if (opts.stderr_fd >= 0) {
      if (!onto(opts.stderr_fd, 2)) goto fail;
    } else if (!opts.stderr_file.empty()) {
      int fd = ::open(opts.stderr_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0 || ::dup2(fd, 2) < 0) goto fail;
    }
    ::execvpe(cargv[0], cargv.data(), cenv.data());
  fail:
    int why[2] = {errno, -1};
    (void)!::write(errpipe[1], why, sizeof why);
    ::_exit(127);
  }
  ::close(std::exchange(errpipe[1], -1));
  if (opts.capture_stdout) ::close(std::exchange(outpipe[1], -1));
  // A child that is not to run, or could not: closing the gate first lets a held child exit.
  auto give_up = [&] {
    close_all();
    ::waitpid(pid, nullptr, 0);
  };
  if (opts.before_exec) {
    ::close(std::exchange(gate[0], -1));
    try {
      opts.before_exec(pid);
    } catch (...) {
      give_up();
      throw;
    }
    const char go = 1;
    NoSigpipe no_sigpipe;  // a child killed meanwhile: EPIPE, not gpuckpt's death
    if (const int err = write_fully(gate[1], &go, 1)) {
      give_up();  // the child cannot have exec'd: nothing ran
      throw_syserr(Errc::kInternal, err, "starting ", argv[0]);
    }
    ::close(std::exchange(gate[1], -1));
  }
  int why[2] = {0, -1};  // errno, and the namespace fd it came from (-1: none)
  ssize_t n;
  do {
    n = ::read(errpipe[0], why, sizeof why);
  } while (n < 0 && errno == EINTR);
  ::close(std::exchange(errpipe[0], -1));
  if (n == sizeof why) {
    give_up();
    if (why[1] >= 0) {
      std::error_code ec;
      const std::string ns =
          fs::read_symlink("/proc/self/fd/" + std::to_string(why[1]), ec).string();
      throw_syserr(Errc::kInvalidInput, why[0], "cannot join the namespace ",
                   ns.empty() ? "fd " + std::to_string(why[1]) : ns, " to run ", argv[0]);
    }
    throw_syserr(Errc::kInvalidInput, why[0], "cannot run ", argv[0]);
  }
  Child c;
  c.pid_ = pid;
  if (opts.capture_stdout) c.out_.reset(outpipe[0]);
  return c;
}

RunResult run_capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                      const SpawnOptions& opts_in) {
  SpawnOptions opts = opts_in;
  opts.capture_stdout = true;
  Child c = spawn(argv, opts);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  RunResult r;
  char buf[65536];
  for (;;) {
    const int left_ms = poll_timeout_ms(deadline);
    if (left_ms == 0) {
      c.kill(SIGKILL);
      c.wait();
      throw Error(Errc::kTimeout,
                  argv[0] + " did not finish within " + std::to_string(timeout.count()) + " ms");
    }
    pollfd p{c.stdout_fd(), POLLIN, 0};
    int pr = ::poll(&p, 1, left_ms);
    if (pr < 0 && errno != EINTR) throw_errno(Errc::kInternal, "poll");
    if (pr <= 0) continue;
    ssize_t n = ::read(c.stdout_fd(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  auto st = c.wait_for(std::max(left, std::chrono::milliseconds(1)));
  if (!st) {
    c.kill(SIGKILL);
    c.wait();
    throw Error(Errc::kTimeout,
                argv[0] + " did not exit within " + std::to_string(timeout.count()) + " ms");
  }
  r.status = *st;
  return r;
}

std::optional<fs::path> find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return fs::path(name);
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    fs::path cand = fs::path(p.substr(start, end - start)) / name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return std::nullopt;
}

fs::path self_exe_dir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return fs::current_path();
  return p.parent_path();
}

}  // namespace gpuckpt
