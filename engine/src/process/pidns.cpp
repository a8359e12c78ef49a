#include "process/pidns.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "gpuckpt/error.h"
#include "util/no_sigpipe.h"
#include "util/pipe.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::process {

namespace {

// Only async-signal-safe calls between fork() and exec()/_exit() below: the caller may be
// multi-threaded (io_uring and compression workers).
struct ArgArea {
  char* start = nullptr;
  std::size_t size = 0;
};

// Where this process's command line lives (/proc/self/stat fields 48-49). The init is a fork
// of gpuckpt and would otherwise show gpuckpt's whole command line in ps for as long as the
// restored service runs.
ArgArea arg_area() {
  std::ifstream in("/proc/self/stat");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  const auto close = s.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream f(s.substr(close + 2));
  std::string field;
  unsigned long start = 0, end = 0;
  for (int i = 3; f >> field; ++i) {  // field 3 is the state
    if (i == 48) start = std::stoul(field);
    if (i == 49) {
      end = std::stoul(field);
      break;
    }
  }
  if (!start || end <= start) return {};
  return {reinterpret_cast<char*>(start), end - start};
}

[[noreturn]] void ns_init(char* const* argv, char* const* envp, const char* out_path, int report,
                          int gate, ArgArea args, int max_fd) {
  ::prctl(PR_SET_NAME, "gpuckpt-pidns", 0, 0, 0);
  static const char kTitle[] = "gpuckpt-pidns (init of a restored process's pid namespace)";
  if (args.start && args.size > 1) {
    std::memset(args.start, 0, args.size);
    std::memcpy(args.start, kTitle, std::min(args.size - 1, sizeof kTitle - 1));
  }
  // Our /proc must not leak into the host's mount tree; host mounts still propagate in.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0 ||
      ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    int st = 126 << 8;  // a wait status saying "exited with 126": could not set up
    (void)!::write(report, &st, sizeof st);
    ::_exit(126);
  }
  // criu starts only once gpuckpt has said whoever must undo it knows this namespace: EOF
  // (gpuckpt gone, or it could not tell) ends the namespace before anything is restored.
  char go = 0;
  ssize_t n;
  do {
    n = ::read(gate, &go, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) {
    int st = 125 << 8;
    (void)!::write(report, &st, sizeof st);
    ::_exit(125);
  }
  ::close(gate);
  const int devnull = ::open("/dev/null", O_RDWR);
  const pid_t criu = ::fork();
  if (criu == 0) {
    const int out = ::open(out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (devnull < 0 || out < 0 || ::dup2(devnull, 0) < 0 || ::dup2(out, 1) < 0 ||
        ::dup2(out, 2) < 0)
      ::_exit(127);
    ::close(report);
    ::execve(argv[0], argv, envp);
    ::_exit(127);
  }
  // The init keeps nothing of gpuckpt's: no terminal, no pipes a caller waits on for EOF.
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  // report is fd 3. Kernels before 5.9 have no close_range: then one close() per possible fd.
  if (::syscall(SYS_close_range, static_cast<unsigned>(report) + 1, ~0u, 0u) != 0)
    for (int fd = report + 1; fd < max_fd; ++fd) ::close(fd);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(-1, &status, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      ::_exit(0);  // ECHILD: the namespace is empty
    }
    if (r == criu) {
      (void)!::write(report, &status, sizeof status);
      ::close(report);
    }
  }
}

}  // namespace

PidnsRun run_in_new_pidns(const std::vector<std::string>& argv_in,
                          const std::vector<std::string>& env, const fs::path& out_file,
                          std::chrono::seconds timeout, const std::function<void(pid_t)>& on_init,
                          const std::function<void()>& on_started) {
  std::vector<char*> argv;
  for (const auto& a : argv_in) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> envs = environment_with(env);
  std::vector<char*> envp;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string out_path = out_file.string();
  const ArgArea args = arg_area();
  // The fd limit, read before fork(): sysconf() is not async-signal-safe.
  const long open_max = ::sysconf(_SC_OPEN_MAX);
  const int max_fd = open_max > 0 ? static_cast<int>(std::min(open_max, 1L << 20)) : 1024;

  // The init writes criu's wait status here; the helper writes the init's host pid first.
  auto [rd, wr] = make_pipe();
  // One byte on it lets the init start criu.
  auto [gate_rd, gate_wr] = make_pipe();

  const pid_t helper = ::fork();
  if (helper < 0) throw_errno(Errc::kInternal, "fork");
  if (helper == 0) {
    ::setsid();
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) ::_exit(125);
    const pid_t init = ::fork();
    if (init == 0) {
      // The report fd must survive close_range in the init: move it to fd 3.
      if (wr.get() == 3 ? ::fcntl(3, F_SETFD, 0) < 0 : ::dup3(wr.get(), 3, 0) < 0) ::_exit(125);
      // Our copy of the gate's write end would keep the init from ever seeing gpuckpt gone.
      ::close(gate_wr.get());
      ns_init(argv.data(), envp.data(), out_path.c_str(), 3, gate_rd.get(), args, max_fd);
    }
    if (init < 0) ::_exit(125);
    (void)!::write(wr.get(), &init, sizeof init);
    ::_exit(0);  // the init is adopted by the host's reaper, independent of gpuckpt
  }
  wr.reset();
  gate_rd.reset();
  int hs = 0;
  while (::waitpid(helper, &hs, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(hs) || WEXITSTATUS(hs) != 0) {
    throw Error(Errc::kProcess,
                "cannot create a pid namespace for the restore (unshare/fork "
                "failed, exit " +
                    std::to_string(WEXITSTATUS(hs)) + "); gpuckpt must run as root");
  }
  PidnsRun run;
  if (::read(rd.get(), &run.init_pid, sizeof run.init_pid) != sizeof run.init_pid)
    throw Error(Errc::kInternal, "pid namespace helper did not report its init");
  try {
    if (on_init) on_init(run.init_pid);
  } catch (...) {
    ::kill(run.init_pid, SIGKILL);  // criu never started in it
    throw;
  }
  const char go = 1;
  NoSigpipe nosig;  // an init that failed its setup has closed the gate: EPIPE, not a death
  if (::write(gate_wr.get(), &go, 1) != 1) {
    const int err = errno;
    ::kill(run.init_pid, SIGKILL);
    throw_syserr(Errc::kInternal, err, "cannot start criu in the pid namespace");
  }
  gate_wr.reset();
  if (on_started) on_started();

  pollfd p{rd.get(), POLLIN, 0};
  int pr;
  do {
    pr = ::poll(&p, 1, static_cast<int>(timeout.count() * 1000));
  } while (pr < 0 && errno == EINTR);
  int status = 0;
  if (pr <= 0 || ::read(rd.get(), &status, sizeof status) != sizeof status) {
    // Killing the init kills everything in the namespace: criu and any half-restored task.
    ::kill(run.init_pid, SIGKILL);
    if (pr <= 0)
      throw Error(Errc::kTimeout, "criu restore (in a new pid namespace) did not finish within " +
                                      std::to_string(timeout.count()) + " s and was killed");
    throw Error(Errc::kCriu, "the pid namespace's init ended without reporting criu's status");
  }
  if (WIFEXITED(status))
    run.criu = {true, WEXITSTATUS(status)};
  else
    run.criu = {false, WIFSIGNALED(status) ? WTERMSIG(status) : -1};
  return run;
}

namespace {

std::string ns_link(pid_t pid) {
  std::error_code ec;
  return fs::read_symlink("/proc/" + std::to_string(pid) + "/ns/pid", ec).string();
}

std::vector<long> nspids(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("NSpid:", 0) == 0) {
      std::istringstream f(line.substr(6));
      std::vector<long> v;
      for (long x; f >> x;) v.push_back(x);
      return v;
    }
  }
  return {};
}

}  // namespace

pid_t innermost_pid(pid_t host_pid) {
  auto v = nspids(host_pid);
  return v.empty() ? host_pid : static_cast<pid_t>(v.back());
}

pid_t host_pid_in_ns(pid_t init_pid, pid_t ns_pid) {
  const std::string ns = ns_link(init_pid);
  if (ns.empty())
    throw Error(Errc::kProcess, "the restore's pid namespace (init " + std::to_string(init_pid) +
                                    ") is gone: the restored process exited");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    const auto v = nspids(pid);
    if (v.size() >= 2 && v.back() == ns_pid && ns_link(pid) == ns) return pid;
  }
  throw Error(Errc::kProcess, "no process with pid " + std::to_string(ns_pid) +
                                  " in the restore's pid namespace: it exited right after restore");
}

}  // namespace gpuckpt::process
