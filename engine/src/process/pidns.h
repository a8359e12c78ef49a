// Restoring into a fresh pid namespace. CRIU gives a restored task its checkpointed pid; on the
// machine it was dumped on that pid is still taken while the original is kept frozen (migrate)
// or still runs (a --leave-running snapshot). Inside a new pid namespace the task gets its old
// pid there and a different one on the host, so both can exist at once.
//
// Layout: gpuckpt forks a helper that unshares pid+mount namespaces and forks the namespace's
// init ("gpuckpt-pidns" on the host): it mounts a /proc of the new namespace (CRIU resolves
// restored pids through /proc), runs `criu restore -d`, reports criu's exit status, and then
// stays as the reaper that adopts the restored tree; it exits when the tree has exited.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "util/subprocess.h"

namespace gpuckpt::process {

struct PidnsRun {
  ExitStatus criu;      // criu's exit status
  pid_t init_pid = -1;  // host pid of the namespace's init
};

// Runs argv (a criu restore command line) as described above, its stdout/stderr appended to
// `out_file`. Past `timeout` the whole namespace is killed and Error(kTimeout) is thrown.
// `on_init` is called with the init's host pid as soon as it exists, before criu may start:
// criu starts once it returns, and never if it throws (the namespace is killed, and the
// exception passes on) or if this process dies first. `on_started` is called once criu may run.
PidnsRun run_in_new_pidns(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                          const std::filesystem::path& out_file, std::chrono::seconds timeout,
                          const std::function<void(pid_t)>& on_init = nullptr,
                          const std::function<void()>& on_started = nullptr);

// Host pid of the process that has pid `ns_pid` in the namespace whose init is `init_pid`;
// throws Error(kProcess) if there is none.
pid_t host_pid_in_ns(pid_t init_pid, pid_t ns_pid);

// The pid a process has in its own (innermost) pid namespace: last field of NSpid.
pid_t innermost_pid(pid_t host_pid);

}  // namespace gpuckpt::process
