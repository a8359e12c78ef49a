// gpuckpt::dump(): preflight, criu dump (the plugin locks and checkpoints CUDA inside it), pack
// of CRIU's images into the checkpoint, then the end of the original process.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <optional>

#include "criu/criu.h"
#include "criu/plugin_report.h"
#include "criu/stats.h"
#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "process/dump_impl.h"
#include "process/proc_info.h"
#include "process/stages.h"
#include "process/support.h"
#include "util/fs.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace process {

namespace {

void preflight_output(const DumpOptions& o) {
  if (o.output.empty()) throw Error(Errc::kUsage, "no output checkpoint path given");
  std::error_code ec;
  if (fs::exists(o.output, ec) && !o.pack.force)
    throw Error(Errc::kExists, o.output.string() + " exists (use --force to replace it)");
  const fs::path parent = o.output.parent_path().empty() ? "." : o.output.parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(Errc::kInvalidInput, "output directory " + parent.string() + " does not exist");
  if (!fs::is_directory(o.staging_root, ec))
    throw Error(Errc::kInvalidInput,
                "staging directory " + o.staging_root.string() + " does not exist");
}

std::string state_after_failure(pid_t pid) {
  auto p = read_proc(pid);
  if (!p || p->state == 'Z') return "the process is gone";
  if (p->state == 'T')
    return "the process is stopped (resume it with kill -CONT " + std::to_string(pid) + ")";
  return "the process continues to run";
}

}  // namespace

DumpOutcome dump_keep_stopped(const DumpOptions& o) {
  if (o.pid <= 0) throw Error(Errc::kUsage, "no pid given");
  if (o.pid == ::getpid()) throw Error(Errc::kUsage, "gpuckpt cannot dump itself");
  preflight_output(o);
  const auto info = read_proc(o.pid);
  if (!info || info->state == 'Z')
    throw Error(Errc::kProcess, "no process with pid " + std::to_string(o.pid));
  if (info->state == 'T' || info->state == 't')
    throw Error(Errc::kProcess, "process " + std::to_string(o.pid) + " (" + info->comm +
                                    ") is stopped or traced; resume it before dumping");

  DumpOutcome out;
  Timeline& tl = out.result.timeline;
  ProcessRecord& rec = out.record;
  std::optional<Timeline::Scope> preflight;
  preflight.emplace(tl, "preflight");
  const criu::Installation inst = criu::locate(o.criu.binary);
  rec.criu_version = criu::version(inst);
  if (o.criu.check) criu::check(inst);
  if (inst.plugin_dir.empty())
    spdlog::warn(
        "gpuckpt's CRIU plugin ({}) was not found: no device stages are recorded and "
        "CUDA processes cannot be dumped (set GPUCKPT_CRIU_PLUGIN_DIR)",
        criu::kPluginFile);

  // CRIU would find out after freezing the process for as long as it took to fill the tmpfs.
  const std::uint64_t need = dumpable_memory_bytes(o.pid);
  const std::uint64_t free_bytes = fs::space(o.staging_root).available;
  if (need > free_bytes)
    throw Error(Errc::kIo, "the staging directory " + o.staging_root.string() + " has " +
                               std::to_string(free_bytes >> 20) + " MiB free, but process " +
                               std::to_string(o.pid) + " has " + std::to_string(need >> 20) +
                               " MiB of memory to dump: use --staging DIR on a larger filesystem");

  rec.pid = o.pid;
  rec.comm = info->comm;
  rec.cmdline = info->cmdline;
  rec.exe = info->exe;
  rec.hostname = hostname();
  rec.shell_job = criu::needs_shell_job(o.pid);
  rec.leave_running = o.leave_running;
  rec.gpu_uuids = nvidia_gpu_uuids(o.pid);

  TempDir staging(o.staging_root, "gpuckpt-dump");
  const fs::path images = staging.path() / "images";
  fs::create_directory(images);

  criu::DumpArgs a;
  a.pid = o.pid;
  a.images_dir = images;
  a.final_state = o.leave_running ? criu::FinalState::kRunning : criu::FinalState::kStopped;
  a.shell_job = rec.shell_job;
  a.extra_args = o.criu.extra_args;
  a.timeout = o.criu.timeout;
  // CRIU's --timeout bounds the freezing stage, which includes the plugin's CUDA lock.
  a.freeze_timeout =
      std::chrono::duration_cast<std::chrono::seconds>(o.lock_timeout) + std::chrono::seconds(10);
  const fs::path report_path = images / criu::kDumpReportName;
  a.env = {std::string(criu::kEnvReport) + "=" + report_path.string(),
           std::string(criu::kEnvFinalState) + "=" + (o.leave_running ? "running" : "stopped"),
           std::string(criu::kEnvLockTimeoutMs) + "=" + std::to_string(o.lock_timeout.count())};
  const auto argv = criu::dump_argv(inst, a, images / "dump.log");
  rec.criu_args.assign(argv.begin() + 1, argv.end());
  preflight.reset();

  criu::Run run;
  {
    DirProgress progress(o.pack.progress, "criu_dump", images, need);
    try {
      run = criu::dump(inst, a);
    } catch (const Error& e) {
      // A failed CUDA step inside criu is the cause to report, not criu's "Dumping FAILED".
      std::optional<criu::PluginReport> rep;
      try {
        rep = criu::read_plugin_report(report_path);
      } catch (const Error&) {
      }
      const bool device = rep && !rep->all_ok();
      throw Error(device ? Errc::kDevice : e.code(),
                  (device ? "CUDA checkpoint failed: " + rep->first_error() + "\n" : "") +
                      e.what() + "\n" + state_after_failure(o.pid));
    }
  }
  // From here on a stopped process must not be lost: if anything fails before the checkpoint
  // is durable, it is resumed, exactly as if the dump had not happened.
  try {
    out.result.image_bytes = tree_bytes(images);
    const auto stats = criu::read_dump_stats(images);
    const auto plugin = criu::read_plugin_report(report_path);
    if (!plugin && !inst.plugin_dir.empty())
      spdlog::warn("the CRIU plugin wrote no report ({}): device stages are missing",
                   report_path.string());
    add_dump_stages(tl, run, out.result.image_bytes, stats, plugin);
    rec.cuda = plugin && plugin->cuda;
    out.result.gpu = rec.cuda;
    out.result.gpu_uuids = rec.gpu_uuids;
    out.result.criu_version = rec.criu_version;
    out.result.comm = rec.comm;

    rec.timeline = tl;
    PackOptions po = o.pack;
    po.extra_json = to_extra_json(rec);
    auto scope = tl.scope("compress_write");
    const TransferResult tr = pack(images, o.output, po);
    scope.set_bytes(tr.raw_bytes);
  } catch (const std::exception& e) {
    const auto* ge = dynamic_cast<const Error*>(&e);
    std::string what = std::string(e.what()) + "\nno checkpoint was written; ";
    if (!o.leave_running) {
      try {
        resume_stopped(o.pid, rec.cuda);
        what += "process " + std::to_string(o.pid) + " was resumed";
      } catch (const Error& re) {
        what += re.what();
      }
    } else {
      what += "the process continues to run";
    }
    throw Error(ge ? ge->code() : Errc::kInternal, what);
  }
  std::error_code ec;
  out.result.checkpoint_bytes =
      fs::is_directory(o.output, ec) ? tree_bytes(o.output) : fs::file_size(o.output, ec);
  return out;
}

}  // namespace process

DumpResult dump(const DumpOptions& opts) {
  process::DumpOutcome out = process::dump_keep_stopped(opts);
  if (!opts.leave_running && !process::kill_and_wait(opts.pid)) {
    throw Error(Errc::kProcess, "the checkpoint " + opts.output.string() +
                                    " is complete, but process " + std::to_string(opts.pid) +
                                    " did not end after SIGKILL (it is left stopped)");
  }
  return std::move(out.result);
}

}  // namespace gpuckpt
