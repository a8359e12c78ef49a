// Child processes (criu, the kernels runner, services under test) with RAII: a Child that is
// destroyed while still running is killed and reaped, so no error path leaks processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/unique_fd.h"

namespace gpuckpt {

// A child's whole environment: this process's, with each of `overrides` ("KEY=VALUE") in place
// of any entry of the same KEY; an override without '=' is left out.
std::vector<std::string> environment_with(const std::vector<std::string>& overrides);

// The KEY and the VALUE of a "KEY=VALUE" entry; nullopt where it has no '='.
std::optional<std::pair<std::string, std::string>> split_env_entry(const std::string& kv);

struct SpawnOptions {
  std::vector<std::string> env;       // extra "KEY=VALUE" entries on top of environ
  bool capture_stdout = false;        // stdout -> pipe (Child::stdout_fd)
  std::filesystem::path stdout_file;  // else: stdout -> this file (appended), if set
  std::filesystem::path stderr_file;  // stderr -> this file, if set; else inherited
  bool null_stdin = true;             // stdin from /dev/null
  bool new_session = false;           // setsid(): detach from our terminal/job control
  // setpgid(0, 0): out of our process group, so that a Ctrl-C to gpuckpt's group reaches
  // gpuckpt alone (criu must not be interrupted behind the back of the recovery logic).
  bool new_process_group = false;
  // SIGKILL when the thread that spawned it ends (PR_SET_PDEATHSIG): a helper whose output is
  // gpuckpt's to clean up (tar into a directory the guard removes) must not outlive gpuckpt.
  bool die_with_parent = false;
  int stdin_fd = -1;   // >= 0: this fd becomes the child's stdin (wins over null_stdin)
  int stdout_fd = -1;  // >= 0: this fd becomes the child's stdout (wins over the others)
  int stderr_fd = -1;  // >= 0: this fd becomes the child's stderr (wins over stderr_file)
  std::filesystem::path cwd;
  // Namespaces (nsfs fds, open until spawn returns) the child joins before it runs anything.
  std::vector<int> namespace_fds;
  // Called in the parent with the child's pid before the child runs anything: the child execs
  // only once this returns, and exits unexecuted (127) if it throws or this process dies
  // first. For a child that must be known (to the guard) before it can act.
  std::function<void(pid_t)> before_exec;
};

struct ExitStatus {
  bool exited = false;  // normal exit (else killed by a signal)
  int code = 0;         // exit code, or signal number
  bool ok() const { return exited && code == 0; }
  std::string describe() const;
};

class Child {
 public:
  Child() = default;
  Child(Child&& o) noexcept;
  Child& operator=(Child&& o) noexcept;
  ~Child();

  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_.get(); }
  bool running() const { return pid_ > 0; }

  ExitStatus wait();
  // Returns nullopt if the child is still running after `timeout`.
  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout);
  void kill(int sig);
  pid_t release();  // forget the child (it keeps running; the caller owns it)

 private:
  friend Child spawn(const std::vector<std::string>&, const SpawnOptions&);
  pid_t pid_ = -1;
  UniqueFd out_;
};

// Throws Error(kInvalidInput) if argv[0] cannot be executed.
Child spawn(const std::vector<std::string>& argv, const SpawnOptions& opts = {});

struct RunResult {
  ExitStatus status;
  std::string output;  // captured stdout
};
// Runs to completion, capturing stdout; kills it and throws Error(kTimeout) past `timeout`.
RunResult run_capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                      const SpawnOptions& opts = {});

// Finds an executable: an absolute/relative path as is, else searched in PATH.
std::optional<std::filesystem::path> find_executable(const std::string& name);

// Directory holding the running executable (/proc/self/exe), to find sibling binaries.
std::filesystem::path self_exe_dir();

}  // namespace gpuckpt
