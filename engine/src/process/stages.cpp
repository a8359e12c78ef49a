#include "process/stages.h"
#include "gpuckpt/names.h"

#include <algorithm>
#include <string>
#include <vector>

namespace gpuckpt::process {

namespace {

using Clock = Timeline::Clock;

Clock::time_point at_ns(std::int64_t ns) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

Clock::duration us(std::uint64_t v) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(v));
}

// Stages collected first and added in start order, so tables read chronologically.
class Pending {
 public:
  void add(std::string name, Clock::time_point start, Clock::time_point end,
           std::uint64_t bytes = 0) {
    v_.push_back({std::move(name), start, end, bytes});
  }
  // A tree's processes each have their own device stages: "device_lock@1234" once the report
  // covers more than one process, the plain name otherwise. Where some of a tree's processes
  // hold CUDA state, the hooks that had nothing to do in the others are left out: a
  // "device_checkpoint@FRONT" of 0 s would read as a front that was checkpointed. Where cuInit
  // was paid (cuda_init, not skipped) stays, whichever process it was.
  void add_plugin(const criu::PluginReport& plugin) {
    bool several = false;
    for (const auto& h : plugin.hooks) several |= h.pid != plugin.hooks.front().pid;
    const auto& cuda = plugin.cuda_pids;
    for (const auto& h : plugin.hooks) {
      if (several && h.skipped && !cuda.empty() &&
          std::find(cuda.begin(), cuda.end(), h.pid) == cuda.end())
        continue;
      add(several ? h.name + "@" + std::to_string(h.pid) : h.name, at_ns(h.start_ns),
          at_ns(h.end_ns));
    }
  }
  void flush(Timeline& tl) {
    std::stable_sort(v_.begin(), v_.end(),
                     [](const Item& a, const Item& b) { return a.start < b.start; });
    for (const auto& i : v_) tl.add(i.name, i.start, i.end, i.bytes);
    v_.clear();
  }

 private:
  struct Item {
    std::string name;
    Clock::time_point start, end;
    std::uint64_t bytes;
  };
  std::vector<Item> v_;
};

}  // namespace

void add_dump_stages(Timeline& tl, const criu::Run& run, std::uint64_t image_bytes,
                     const std::optional<criu::DumpStats>& stats,
                     const std::optional<criu::PluginReport>& plugin) {
  Pending p;
  p.add(stage::kCriuDump, run.start, run.end, image_bytes);
  const criu::PluginHook* lock = plugin ? plugin->find(stage::kDeviceLock) : nullptr;
  // CRIU dumps memory once every task's device checkpoint has ended (they may run together).
  const criu::PluginHook* ckpt = plugin ? plugin->last_to_end(stage::kDeviceCheckpoint) : nullptr;
  if (stats) {
    // PAUSE_DEVICES (device_lock) is the first thing CRIU does once its freezing timer starts.
    Clock::time_point freeze_start =
        lock ? at_ns(lock->start_ns)
             : std::max(run.start, run.end - us(stats->frozen_us) - us(stats->freezing_us));
    const auto frozen_start = freeze_start + us(stats->freezing_us);
    p.add(stage::kFreeze, freeze_start, frozen_start);
    p.add(stage::kFrozen, frozen_start, frozen_start + us(stats->frozen_us));
    const auto mem_start = ckpt ? std::max(frozen_start, at_ns(ckpt->end_ns)) : frozen_start;
    const auto mem_end = mem_start + us(stats->memdump_us);
    const std::uint64_t page_bytes = stats->pages_written * 4096;
    p.add(stage::kCriuMemdump, mem_start, mem_end, page_bytes);
    // CRIU times the page writes inside the page dump (mem.c): memwrite is nested in memdump.
    p.add(stage::kCriuMemwrite, mem_end - us(stats->memwrite_us), mem_end, page_bytes);
  }
  if (plugin) p.add_plugin(*plugin);
  p.flush(tl);
}

void add_restore_stages(Timeline& tl, const criu::Run& run,
                        const std::optional<criu::RestoreStats>& stats,
                        const std::optional<criu::PluginReport>& plugin,
                        const criu::RestoreLogSpans& spans) {
  Pending p;
  p.add(stage::kCriuRestore, run.start, run.end);
  if (stats) {
    p.add(stage::kCriuForking, run.start, run.start + us(stats->forking_us));
    p.add(stage::kCriuRestoreTasks, run.start, run.start + us(stats->restore_us),
          stats->pages_restored * 4096);
  }
  // Clamped in seconds, before any conversion: the log's figures are inside the run.
  const double run_s = std::chrono::duration<double>(run.end - run.start).count();
  auto at = [&](double s) {
    return run.start + us(static_cast<std::uint64_t>(std::clamp(s, 0.0, run_s) * 1e6));
  };
  if (const auto& f = spans.fill) p.add(stage::kMemoryFill, at(f->start_s), at(f->end_s), f->bytes);
  if (const auto& c = spans.copy) p.add(stage::kMemoryCopy, at(c->start_s), at(c->end_s), c->bytes);
  if (plugin) p.add_plugin(*plugin);
  p.flush(tl);
}

}  // namespace gpuckpt::process
