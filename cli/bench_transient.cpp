// `gpuckpt bench coldstart | restore | migrate`: the three transient wall-clock numbers of the
// report, per stage, each up to the service's first answer through the readiness probe. Their
// --json output is what `gpuckpt report --coldstart/--restore/--migrate` reads.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>

#include "commands.h"
#include "flags.h"
#include "gpuckpt/names.h"

namespace gpuckpt::cli {

namespace {

void print_runs(const char* what, const std::vector<Timeline>& runs) {
  const Timeline& m = median_run(runs);
  if (runs.size() > 1) {
    std::printf("%s: %zu runs:", what, runs.size());
    for (const auto& t : runs) std::printf(" %s", format_seconds(t.total_seconds()).c_str());
    std::printf("\n%s, median run %s:\n", what, format_seconds(m.total_seconds()).c_str());
  } else {
    std::printf("%s: %s\n", what, format_seconds(m.total_seconds()).c_str());
  }
  print_stages(m);
}

// ---- coldstart ------------------------------------------------------------------------------

// The service runs in its own session, so a Ctrl-C on gpuckpt's terminal does not reach it:
// if gpuckpt is interrupted mid-run, its service group is killed before gpuckpt dies of the
// same signal (cli/signals.cpp runs the OnInterrupt hooks).
std::atomic<pid_t> g_service_pgid{0};

struct ColdArgs {
  ProbeFlags probe{.timeout_s = 120};
  int runs = 3;
  double stop_timeout_s = 10;
  std::string log;
  std::vector<std::string> command;
};

void run_coldstart(const ColdArgs& a, Context& ctx) {
  ColdStartOptions o;
  o.argv = a.command;
  o.probe = a.probe.probe();
  o.stop_timeout = std::chrono::milliseconds(static_cast<long>(a.stop_timeout_s * 1000));
  o.log_file = a.log;
  o.on_running = [](pid_t pgid) { g_service_pgid = pgid; };
  OnInterrupt kill_service([]() -> std::string {
    const pid_t pg = g_service_pgid.load();
    if (pg <= 0) return {};
    ::kill(pg, SIGKILL);  // not yet the leader of its group: it dies before it can be one
    ::kill(-pg, SIGKILL);
    return "the benchmark's service (process group " + std::to_string(pg) + ") was killed";
  });
  std::vector<Timeline> runs;
  for (int i = 0; i < a.runs; ++i) {
    runs.push_back(measure_cold_start(o));
    spdlog::info("cold start run {}/{}: {}", i + 1, a.runs,
                 format_seconds(runs.back().total_seconds()));
  }
  if (ctx.json) {
    const nlohmann::json extra = {{"command", a.command}, {"probe", describe_probe(o.probe)}};
    ctx.emit_ordered(bench_json("coldstart", runs, extra));
    return;
  }
  print_runs("cold start (decision -> first answer)", runs);
}

// ---- restore --------------------------------------------------------------------------------

struct RestoreArgs {
  std::string checkpoint, gpu_map, staging = "/dev/shm";
  ProbeFlags probe{.timeout_s = 120};
  CriuFlags criu;
  int runs = 1;
  unsigned copy_streams = 0;
  bool keep = false, new_pidns = false;
  double stop_timeout_s = 10;
};

void run_restore(const RestoreArgs& a, Context& ctx) {
  RestoreOptions o;
  o.checkpoint = a.checkpoint;
  if (!a.gpu_map.empty()) o.gpu_map = parse_gpu_map(a.gpu_map);
  o.staging_root = a.staging;
  o.probe = a.probe.probe();
  o.new_pid_ns = a.new_pidns;
  o.copy_streams = a.copy_streams;
  o.criu = a.criu.settings();
  const auto grace = std::chrono::milliseconds(static_cast<long>(a.stop_timeout_s * 1000));
  std::vector<Timeline> runs;
  RestoreResult last;
  // The copy between its restore and the end of its stop: an interrupt then ends it (a restore
  // in flight is its guard's business, which leaves its copy running and says so). Shared: the
  // hook runs on the signal-handling thread.
  struct Current {
    std::mutex mu;
    std::optional<RestoreResult> copy;
  };
  const auto current = std::make_shared<Current>();
  const OnInterrupt end_copy([current]() -> std::string {
    std::lock_guard lk(current->mu);
    if (!current->copy) return {};
    const auto left = stop_restored(*current->copy, std::chrono::milliseconds(0));
    return "the restored copy (pid " + std::to_string(current->copy->pid) + ") was " +
           (left.empty() ? "ended"
                         : "killed, but pid " + std::to_string(left.front()) + " is still there");
  });
  auto set_current = [&](std::optional<RestoreResult> r) {
    std::lock_guard lk(current->mu);
    current->copy = std::move(r);
  };
  for (int i = 0; i < a.runs; ++i) {
    last = restore(o);
    const bool stop = i + 1 < a.runs || !a.keep;  // the last one stays up with --keep
    if (stop) set_current(last);
    runs.push_back(last.timeline);
    spdlog::info("restore run {}/{}: {}", i + 1, a.runs,
                 format_seconds(last.timeline.total_seconds()));
    // The next run restores the same pid: this one must be gone first.
    if (stop) {
      fault_point(fault::kBenchStop);
      const auto left = stop_restored(last, grace);
      set_current(std::nullopt);
      if (!left.empty())
        throw Error(Errc::kProcess, "restored process " + std::to_string(left.front()) +
                                        " is still there after SIGKILL");
    }
  }
  if (ctx.json) {
    nlohmann::json extra = {{"checkpoint", a.checkpoint},
                            {"probe", describe_probe(o.probe)},
                            {"gpu", last.gpu},
                            {"huge_page_bytes", last.huge_page_bytes}};
    // The floors' compression ratio: what this checkpoint's images became on storage.
    if (a.checkpoint.rfind("s3://", 0) != 0) {
      const ImageInfo info = inspect(a.checkpoint);
      extra["image_bytes"] = info.raw_bytes;
      extra["checkpoint_bytes"] = info.compressed_bytes;
    }
    if (a.keep) extra["pid"] = last.pid;
    if (o.probe.kind != ReadinessProbe::Kind::kNone) extra["first_answer"] = last.first_answer;
    ctx.emit_ordered(bench_json("restore", runs, extra));
    return;
  }
  print_runs("restore (interruption -> serving)", runs);
  if (a.keep) std::printf("the restored process runs as pid %d\n", last.pid);
}

// ---- migrate --------------------------------------------------------------------------------

struct MigrateArgs {
  int pid = 0;
  std::string to, gpu_map, staging = "/dev/shm";
  bool keep_checkpoint = false;
  ProbeFlags probe{.timeout_s = 120};
  CriuFlags criu;
};

void run_migrate(const MigrateArgs& a, Context& ctx) {
  MigrateOptions o;
  o.pid = a.pid;
  o.to_dir = a.to;
  if (!a.gpu_map.empty()) o.gpu_map = parse_gpu_map(a.gpu_map);
  o.probe = a.probe.probe();
  o.keep_checkpoint = a.keep_checkpoint;
  o.staging_root = a.staging;
  o.criu = a.criu.settings();
  const MigrateResult r = migrate(o);
  if (ctx.json) {
    nlohmann::json extra = {{"old_pid", r.old_pid},
                            {"new_pid", r.new_pid},
                            {"probe", describe_probe(o.probe)},
                            {"image_bytes", r.image_bytes},
                            {"checkpoint_bytes", r.checkpoint_bytes},
                            {"adaptive_compression", r.adaptive_compression},
                            {"skipped_compression_bytes", r.skipped_compression_bytes},
                            {"huge_page_bytes", r.huge_page_bytes}};
    if (o.probe.kind != ReadinessProbe::Kind::kNone) extra["first_answer"] = r.first_answer;
    ctx.emit_ordered(bench_json("migrate", {r.timeline}, extra));
    return;
  }
  print_runs("migration (decision -> answering elsewhere)", {r.timeline});
  std::printf("pid %d now runs as pid %d\n", r.old_pid, r.new_pid);
}

}  // namespace

void add_bench_transient(CLI::App& bench, Context& ctx) {
  {
    auto a = std::make_shared<ColdArgs>();
    auto* c = bench.add_subcommand(
        "coldstart",
        "Time a service from start to first answer: what a restore is compared "
        "against (gpuckpt bench coldstart --probe tcp:127.0.0.1:8000 -- CMD ARGS...)");
    a->probe.add(c, true);
    c->add_option("--runs", a->runs, "Repetitions (min/median reported)")
        ->check(CLI::Range(1, 1000));
    c->add_option("--stop-timeout", a->stop_timeout_s,
                  "Seconds between SIGTERM and SIGKILL when stopping the service after a run")
        ->check(CLI::PositiveNumber);
    c->add_option("--log", a->log, "Append the service's output to this file");
    c->add_option("command", a->command, "The service command, after --")->required();
    c->fallthrough();  // global flags (--json) may follow, if `bench` passes them on too
    c->callback([a, &ctx] { run_coldstart(*a, ctx); });
  }
  {
    auto a = std::make_shared<RestoreArgs>();
    auto* c =
        bench.add_subcommand("restore", "Time a restore from CKPT to first answer, per stage");
    c->add_option("checkpoint", a->checkpoint, "Checkpoint made by gpuckpt dump")->required();
    c->add_option("--gpu-map", a->gpu_map, "GPU remapping OLD=NEW[,...] (UUIDs or indices)");
    c->add_option("--staging", a->staging, "Where the images are unpacked for CRIU (tmpfs)");
    c->add_flag("--new-pidns", a->new_pidns, "Restore into a new pid namespace");
    c->add_option("--runs", a->runs, "Repetitions; each restored process is ended before the next")
        ->check(CLI::Range(1, 1000));
    c->add_flag("--keep", a->keep, "Leave the last restored process running");
    add_copy_streams(c, a->copy_streams);
    c->add_option("--stop-timeout", a->stop_timeout_s,
                  "Seconds between SIGTERM and SIGKILL when ending a restored process")
        ->check(CLI::PositiveNumber);
    a->probe.add(c, false);
    a->criu.add(c);
    c->fallthrough();  // global flags (--json) may follow, if `bench` passes them on too
    c->callback([a, &ctx] { run_restore(*a, ctx); });
  }
  {
    auto a = std::make_shared<MigrateArgs>();
    auto* c = bench.add_subcommand(
        "migrate", "Migrate a process through DIR and time decision to first answer, per stage");
    c->add_option("--pid", a->pid, "Process to migrate")->required()->check(CLI::PositiveNumber);
    c->add_option("--to", a->to, "Directory the checkpoint is written to and restored from")
        ->required();
    c->add_option("--gpu-map", a->gpu_map, "GPU remapping OLD=NEW[,...] (UUIDs or indices)");
    c->add_option("--staging", a->staging, "tmpfs staging directory for CRIU's images");
    c->add_flag("--keep-checkpoint", a->keep_checkpoint, "Keep the checkpoint afterwards");
    a->probe.add(c, false);
    a->criu.add(c);
    c->fallthrough();  // global flags (--json) may follow, if `bench` passes them on too
    c->callback([a, &ctx] { run_migrate(*a, ctx); });
  }
}

}  // namespace gpuckpt::cli
