#include "process/support.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "device/cuda_checkpoint.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "util/fs.h"

namespace fs = std::filesystem;

namespace gpuckpt::process {

DirProgress::DirProgress(ProgressFn fn, std::string phase, fs::path dir, std::uint64_t total)
    : fn_(std::move(fn)), phase_(std::move(phase)), dir_(std::move(dir)), total_(total) {
  if (!fn_) return;
  thread_ = std::thread([this] {
    const auto start = std::chrono::steady_clock::now();
    while (!stop_.load()) {
      Progress p;
      p.phase = phase_;
      p.total_bytes = total_;
      try {
        p.done_bytes = tree_bytes(dir_);
      } catch (...) {
        // files come and go while CRIU writes; the next sample will do
      }
      p.elapsed_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fn_(p);
      for (int i = 0; i < 5 && !stop_.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

DirProgress::~DirProgress() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void resume_stopped(pid_t pid, bool cuda) {
  if (::kill(pid, SIGCONT) != 0)
    throw_errno(Errc::kProcess, "cannot resume process " + std::to_string(pid) + " (SIGCONT)");
  if (!cuda) return;
  // The CUDA state was checkpointed to host memory by the plugin; the process runs again but
  // its CUDA calls block until it is restored and unlocked.
  try {
    device::restore(pid, GpuMap{});
    device::unlock(pid);
  } catch (const Error& e) {
    throw Error(e.code(), "process " + std::to_string(pid) +
                              " was resumed but its CUDA state could not be restored (it stays "
                              "locked): " +
                              e.what());
  }
}

bool kill_and_wait(pid_t pid, int timeout_ms) {
  if (::kill(pid, SIGKILL) != 0 && errno == ESRCH) return true;
  return wait_ended(pid, std::chrono::milliseconds(timeout_ms));
}

std::string gpu_map_env(const GpuMap& map) {
  std::string s;
  for (const auto& [from, to] : map.pairs) {
    if (!s.empty()) s += ',';
    s += from + "=" + to;
  }
  return s;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

}  // namespace gpuckpt::process
