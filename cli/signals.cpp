// SIGINT, SIGTERM and SIGHUP: whatever gpuckpt is doing, the operation in flight is rolled back
// by its guard (the target resumed, never left frozen) before gpuckpt dies of that signal.
#include "signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <thread>

#include "gpuckpt/gpuckpt.h"

namespace gpuckpt::cli {

namespace {
std::atomic<bool> g_interrupted{false};
}  // namespace

void stop_here_if_interrupted() {
  if (!g_interrupted.load()) return;
  for (;;) ::pause();
}

void install_interrupt_handler(const Context& ctx, bool json) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  // Blocked here, before any other thread exists, so every thread inherits the mask and the
  // signals reach only the waiting thread below (children get the default mask back: spawn()).
  if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;
  std::thread([set, &ctx, json] {
    int sig = 0;
    for (;;) {
      if (::sigwait(&set, &sig) != 0) return;
      // Past a commit there is nothing to undo: the operation finishes and reports itself.
      if (!defer_interrupt(sig)) break;
      std::cerr << "gpuckpt: " << sigabbrev_np(sig)
                << " received after the operation committed: it completes, and its result is "
                   "reported\n"
                << std::flush;
    }
    g_interrupted.store(true);
    const auto undone = interrupt_operations(std::chrono::seconds(120));
    std::string what;
    for (const auto& u : undone) what += (what.empty() ? "" : "; ") + u;
    if (what.empty()) what = "nothing was in flight";
    const std::string msg = std::string("interrupted by ") + sigabbrev_np(sig) + ": " + what;
    ctx.progress_done();
    if (json) ctx.emit({{"ok", false}, {"error", {{"code", "interrupted"}, {"message", msg}}}});
    std::cerr << "gpuckpt: " << msg << "\n" << std::flush;
    std::cout << std::flush;
    // Die of the signal itself, as a shell expects of an interrupted program.
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
    ::_exit(128 + sig);
  }).detach();
}

}  // namespace gpuckpt::cli
