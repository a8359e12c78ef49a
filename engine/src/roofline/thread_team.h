// A team of worker threads, one pinned to each allowed CPU, that run a function in lock-step:
// the unit of the CPU roofline measurements (all cores at once, timed barrier to barrier).
#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace gpuckpt {

class ThreadTeam {
 public:
  // `threads` workers (0 = one per allowed CPU), pinned round-robin to the allowed CPUs.
  explicit ThreadTeam(unsigned threads = 0);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()); }
  // Runs fn(worker_index) on every worker at once; returns the wall-clock seconds from the
  // common start to the last worker's finish. `fn` must not throw.
  double run(const std::function<void(unsigned)>& fn);
  // Shortest of `reps` runs.
  double best_of(int reps, const std::function<void(unsigned)>& fn);

 private:
  void worker(unsigned index, int cpu);

  // Stamps the moment a barrier phase completes, before any thread is released: the start and
  // end of a run, free of the caller's own wake-up latency.
  struct Stamp {
    std::chrono::steady_clock::time_point* at;
    void operator()() noexcept { *at = std::chrono::steady_clock::now(); }
  };

  std::chrono::steady_clock::time_point t0_, t1_;
  std::vector<std::thread> workers_;
  std::barrier<Stamp> start_, end_;  // workers + the calling thread
  const std::function<void(unsigned)>* fn_ = nullptr;
  std::atomic<bool> stop_{false};
};

}  // namespace gpuckpt
