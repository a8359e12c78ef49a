// The cold-start benchmark: what a restore is compared against. Starts the service the way an
// operator would, times it until it answers, and stops it again.
#include <signal.h>
#include <spdlog/spdlog.h>

#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "gpuckpt/process.h"
#include "probe/probe.h"
#include "util/subprocess.h"

namespace gpuckpt {

namespace {

// Stops the service's whole process group (it runs in its own session): a wrapper script's
// children must not outlive the run. SIGTERM first, SIGKILL after the grace period.
void stop_group(Child& child, std::chrono::milliseconds grace) {
  if (!child.running()) return;
  const pid_t pgid = child.pid();
  ::kill(-pgid, SIGTERM);
  if (!child.wait_for(grace)) {
    spdlog::warn("cold start: {} ignored SIGTERM for {} ms; killing it", pgid, grace.count());
    ::kill(-pgid, SIGKILL);
    child.wait();
  }
  ::kill(-pgid, SIGKILL);  // stragglers of the group, if the leader exited first
}

}  // namespace

Timeline measure_cold_start(const ColdStartOptions& o) {
  using K = ReadinessProbe::Kind;
  if (o.argv.empty()) throw Error(Errc::kUsage, "cold start: no service command given");
  if (o.probe.kind == K::kNone)
    throw Error(Errc::kUsage, "cold start: a readiness probe is needed to know when it answers");
  if (o.probe.kind == K::kStdoutLine && !o.probe.request.empty())
    throw Error(Errc::kUsage, "cold start: a request needs a unix: or tcp: probe to be sent on");

  SpawnOptions so;
  so.new_session = true;
  if (o.probe.kind == K::kStdoutLine)
    so.capture_stdout = true;
  else
    so.stdout_file = o.log_file.empty() ? std::filesystem::path("/dev/null") : o.log_file;
  if (!o.log_file.empty()) so.stderr_file = o.log_file;
  // Told before the service runs anything: an interrupt that comes before spawn() returns still
  // finds the service to stop.
  if (o.on_running) so.before_exec = o.on_running;

  Timeline t;  // its origin is the decision to start
  Child child;
  struct Stopper {  // stops the service on every path out, including errors
    Child& c;
    const ColdStartOptions& o;
    ~Stopper() {
      try {
        stop_group(c, o.stop_timeout);
        if (o.on_running) o.on_running(0);
      } catch (...) {
      }
    }
  } stopper{child, o};
  {
    auto s = t.scope(stage::kSpawn);
    child = spawn(o.argv, so);
  }
  const std::string what = o.argv[0];
  const auto exited = [&](std::chrono::milliseconds grace = std::chrono::milliseconds(0)) {
    if (auto st = child.wait_for(grace))
      throw Error(Errc::kProcess, "cold start: " + what + " exited (" + st->describe() +
                                      ") before it answered the probe");
  };
  {
    auto s = t.scope(stage::kReady);
    if (o.probe.kind == K::kStdoutLine) {
      try {
        wait_for_line(child.stdout_fd(), o.probe.target, o.probe.timeout);
      } catch (const Error& e) {
        // Its stdout closed: it is exiting, but may not be reapable yet. Wait briefly for the
        // status, for a clearer message than "EOF".
        if (e.code() == Errc::kProcess) exited(std::chrono::milliseconds(2000));
        throw;
      }
    } else {
      ReadinessProbe connect_only = o.probe;
      connect_only.request.clear();
      wait_ready(connect_only, exited);
    }
  }
  if (!o.probe.request.empty()) {
    // probe.timeout bounds the whole wait, from the decision to the first answer.
    ReadinessProbe ask = o.probe;
    ask.timeout = std::max(std::chrono::milliseconds(1),
                           std::chrono::duration_cast<std::chrono::milliseconds>(
                               t.origin() + o.probe.timeout - Timeline::Clock::now()));
    auto s = t.scope(stage::kFirstAnswer);
    wait_ready(ask, exited);
  }
  return t;
}

}  // namespace gpuckpt
