#include "roofline/thread_team.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

#include "gpuckpt/support.h"

namespace gpuckpt {

namespace {
unsigned team_size(unsigned requested) {
  return requested ? requested : usable_cpus();
}
}  // namespace

ThreadTeam::ThreadTeam(unsigned threads)
    : start_(static_cast<std::ptrdiff_t>(team_size(threads)) + 1, Stamp{&t0_}),
      end_(static_cast<std::ptrdiff_t>(team_size(threads)) + 1, Stamp{&t1_}) {
  const auto cpus = usable_cpu_ids();
  const unsigned n = team_size(threads);
  workers_.reserve(n);
  for (unsigned i = 0; i < n; ++i)
    workers_.emplace_back([this, i, cpu = cpus[i % cpus.size()]] { worker(i, cpu); });
}

ThreadTeam::~ThreadTeam() {
  stop_ = true;
  start_.arrive_and_wait();
  for (auto& t : workers_) t.join();
}

void ThreadTeam::worker(unsigned index, int cpu) {
  // Pinning keeps one worker per core, so first-touched memory stays near the thread using it.
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);  // best effort
  for (;;) {
    start_.arrive_and_wait();
    if (stop_) return;
    (*fn_)(index);
    end_.arrive_and_wait();
  }
}

double ThreadTeam::run(const std::function<void(unsigned)>& fn) {
  fn_ = &fn;
  start_.arrive_and_wait();
  end_.arrive_and_wait();
  fn_ = nullptr;
  return std::chrono::duration<double>(t1_ - t0_).count();
}

double ThreadTeam::best_of(int reps, const std::function<void(unsigned)>& fn) {
  double best = run(fn);
  for (int i = 1; i < reps; ++i) best = std::min(best, run(fn));
  return best;
}

}  // namespace gpuckpt
