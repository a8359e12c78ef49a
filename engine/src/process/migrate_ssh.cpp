// migrate --to ssh://HOST: one SSH connection to `gpuckpt restore -` on HOST is opened before
// anything is frozen; the tree is dumped into a local spool and kept stopped, and each chunk
// of the checkpoint goes out over the connection as it is written, so the transfer runs beside
// the dump. HOST restores once the manifest (written last) arrives, probes, and reports; only
// then does the original end, and only after the controller's commit does the target keep its
// copy. Any failure before that resumes the original here and leaves nothing on HOST
// (remote/ssh.h describes the protocol).
#include "process/migrate_ssh.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include "device/cuda_driver.h"
#include "device/nvml.h"
#include "gpuckpt/error.h"
#include "gpuckpt/migrate_wire.h"
#include "gpuckpt/names.h"
#include "gpuckpt/support.h"
#include "process/dump_impl.h"
#include "process/guard.h"
#include "process/proc_info.h"
#include "process/support.h"
#include "remote/remote_checkpoint.h"
#include "remote/ssh.h"
#include "util/fault.h"
#include "util/pipe.h"
#include "util/poll_timeout.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt::process {

namespace {

// One line of `fd`, waiting at most until `deadline`; nullopt at EOF.
std::optional<std::string> read_line_until(int fd, std::chrono::steady_clock::time_point deadline,
                                           const std::string& what) {
  std::string s;
  for (;;) {
    const int left_ms = poll_timeout_ms(deadline);
    if (left_ms == 0) throw Error(Errc::kTimeout, "no answer from " + what + " in time");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, std::min(left_ms, 1000));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno(Errc::kIo, "poll");
    if (r == 0) continue;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::kIo, "read from ", what);
    if (n == 0) return s.empty() ? std::nullopt : std::optional<std::string>(s);
    if (c == '\n') return s;
    s += c;
  }
}

// The target's answer: one JSON line (a result, sent as one line), or a JSON document over
// several (an error, as gpuckpt --json prints it on its way out); nullopt at EOF.
std::optional<std::string> read_answer(int fd, std::chrono::steady_clock::time_point deadline,
                                       const std::string& what) {
  auto text = read_line_until(fd, deadline, what);
  if (!text) return text;
  while (!json::accept(*text) && text->size() < (1u << 20)) {
    const auto more = read_line_until(fd, deadline, what);
    if (!more) break;
    *text += "\n" + *more;
  }
  return text;
}

// The VRAM the tree holds on `uuid` must fit in what GPU `to` on the target has free (its
// `gpuckpt devices`: total_memory - used_memory). Unknown on either side: said, not guessed.
void check_target_vram(const std::string& uuid, const std::string& to, const json& remote,
                       const std::optional<std::map<std::string, std::uint64_t>>& held,
                       const std::string& where) {
  const json* gpu = nullptr;
  for (const auto& g : remote)
    if (g.value("uuid", "") == to) gpu = &g;
  std::string lower = uuid;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto need =
      held ? held->find(lower) : std::map<std::string, std::uint64_t>::const_iterator{};
  if (!held || need == held->end() || !gpu || !gpu->contains("used_memory") ||
      !(*gpu)["used_memory"].is_number() || !gpu->contains("total_memory")) {
    spdlog::warn(
        "the free VRAM of GPU {} on {} could not be compared with what the process "
        "holds on {}: checked at restore there instead",
        to, where, uuid);
    return;
  }
  const auto total = (*gpu)["total_memory"].get<std::uint64_t>();
  const auto used_there = (*gpu)["used_memory"].get<std::uint64_t>();
  const std::uint64_t free_there = total > used_there ? total - used_there : 0;
  if (need->second > free_there)
    throw Error(Errc::kNoDevice, "GPU " + to + " on " + where + " has " +
                                     std::to_string(free_there >> 20) +
                                     " MiB of VRAM free, but the process holds " +
                                     std::to_string(need->second >> 20) + " MiB on GPU " + uuid +
                                     "; nothing was frozen");
}

}  // namespace

// The driver restores only its own build's checkpoints: the target's NVIDIA kernel module
// (its `gpuckpt devices`) must be this host's. Unknown on either side: checked at the restore
// there, which also compares libcuda's build.
void check_target_driver(const json& devices, const std::string& where, const std::string& here) {
  const std::string there = devices.contains("driver") && devices["driver"].is_object()
                                ? devices["driver"].value("kernel_module_version", std::string())
                                : std::string();
  if (here.empty() || there.empty() || here == there) return;
  throw Error(Errc::kNoDevice, where + " runs NVIDIA driver " + there + ", this host " + here +
                                   ": the driver restores only its own build's checkpoints; "
                                   "nothing was frozen");
}

// Every GPU the tree uses must land on a GPU of the same chip on the target, the one the map
// names (else the same UUID), with room there for the VRAM the tree holds on it. Checked before
// anything is frozen (cuda-checkpoint#44: a restore that does not fit leaves the process stuck).
void check_target_gpus(const std::set<std::string>& used, const json& devices, const GpuMap& map,
                       const std::string& where,
                       const std::optional<std::map<std::string, std::uint64_t>>& held) {
  const DeviceList local = list_devices();
  auto name_of = [](const json& gpus, const std::string& uuid) -> std::optional<std::string> {
    for (const auto& g : gpus)
      if (g.value("uuid", "") == uuid) return g.value("name", "");
    return std::nullopt;
  };
  json local_gpus = json::array();
  for (const auto& g : local.gpus) local_gpus.push_back({{"uuid", g.uuid}, {"name", g.name}});
  const json& remote = devices.contains("gpus") ? devices.at("gpus") : json::array();
  for (const auto& uuid : used) {
    std::string to = uuid;
    for (const auto& [from, dst] : map.pairs)
      if (from == uuid) to = dst;
    const auto there = name_of(remote, to);
    if (!there)
      throw Error(Errc::kNoDevice, where + " has no GPU " + to + " for the process's GPU " + uuid +
                                       " (map it with --gpu-map " + uuid +
                                       "=TARGET_UUID); nothing was frozen");
    const auto here = name_of(local_gpus, uuid);
    if (here && *here != *there)
      throw Error(Errc::kNoDevice, "GPU " + uuid + " is a " + *here + ", but " + to + " on " +
                                       where + " is a " + *there +
                                       ": CUDA state restores only onto the same chip; nothing "
                                       "was frozen");
    check_target_vram(uuid, to, remote, held, where);
  }
}

namespace {

std::string remote_restore_command(const MigrateOptions& o, bool release,
                                   const ContainerMove* box) {
  std::string c = shell_quote(o.remote_gpuckpt) + " --json restore - --await-commit";
  // Beside a frozen original (a real other host has its pids free, a host sharing our pid
  // space does not), the copy gets its own pid namespace; a container's copy has its own.
  if (box) {
    c += " --container " + shell_quote(box->copy_id);
    // Checked there before it answers that it receives, so before anything is frozen here:
    // the ID free there, its runtime, image, rootfs and mount sources, and for CUDA state a
    // runtime whose CRIU loads gpuckpt's plugin.
    json expect = container::target_check_json(box->plan.record);
    if (box->cuda) expect["cuda"] = true;
    c += " --expect-container " + shell_quote(expect.dump());
    // --netns alone for the network, which a target's gpuckpt from before --join-ns takes.
    const auto& joins = o.pod_namespaces;
    if (joins.size() == 1 && joins.begin()->first == PodNamespace::kNetwork)
      c += " --netns " + shell_quote(joins.begin()->second.string());
    else
      for (const auto& a : container::join_ns_args(joins)) c += " " + shell_quote(a);
  } else if (!release)
    c += " --new-pidns --take-endpoints";
  if (!o.remote_spool_root.empty()) c += " --spool " + shell_quote(o.remote_spool_root.string());
  if (!o.gpu_map.empty()) c += " --gpu-map " + shell_quote(o.gpu_map.to_string());
  if (o.staging_mode != StagingMode::kAuto)
    c += " --staging-mode " + std::string(staging_mode_name(o.staging_mode));
  if (!o.huge_pages) c += " --no-huge-pages";
  if (o.probe.kind != ReadinessProbe::Kind::kNone) {
    c += " --probe " + shell_quote(describe_probe(o.probe));
    if (!o.probe.request.empty()) c += " --request " + shell_quote(o.probe.request);
    c += " --probe-timeout " + std::to_string(std::max<long>(1, o.probe.timeout.count() / 1000));
  }
  if (!o.trust.trusted_keys.empty())
    c += " --trusted-keys " + shell_quote(o.trust.trusted_keys.string());
  if (o.trust.require_signature) c += " --require-signature";
  return c;
}

// The target's own stages, on our clock. Its gpuckpt printed its answer as its last stage
// ended, so its timeline ends at `answered` (less the answer's trip back, which is small
// beside the stages; its start is not known here as well: ssh's handshake precedes it).
void add_target_stages(Timeline& tl, const json& answer, Timeline::Clock::time_point answered) {
  if (!answer.contains("timeline")) return;
  Timeline target;
  try {
    target = timeline_from_json(answer.at("timeline"), "the target's timeline");
  } catch (const Error& e) {
    // The copy runs and answered: only its report of how long it took is bad.
    spdlog::warn("{}; the migration's timeline leaves the target's stages out", e.what());
    return;
  }
  const double total = target.total_seconds();
  auto at = [&](double seconds) {
    return answered - std::chrono::duration_cast<Timeline::Clock::duration>(
                          std::chrono::duration<double>(total - seconds));
  };
  for (const Stage& s : target.stages())
    tl.add("target:" + s.name, at(s.start_offset), at(s.start_offset + s.seconds), s.bytes);
}

// The ssh connection carrying the checkpoint out and the target's answers back.
class Connection {
 public:
  Connection(std::vector<std::string> argv) {
    auto [rd, to] = make_pipe();
    to_ = std::move(to);
    SpawnOptions so;
    so.stdin_fd = rd.get();
    so.capture_stdout = true;
    so.new_process_group = true;  // a Ctrl-C is gpuckpt's to handle, not ssh's
    child_ = spawn(argv, so);
  }
  ~Connection() { close(); }
  int in() const { return to_.get(); }
  int out() const { return child_.stdout_fd(); }
  void close_input() { to_.reset(); }
  void close() {
    to_.reset();
    if (child_.running()) {
      child_.kill(SIGKILL);
      child_.wait();
    }
  }
  ExitStatus wait(std::chrono::seconds limit) {
    to_.reset();
    if (auto st = child_.wait_for(limit)) return *st;
    child_.kill(SIGKILL);
    return child_.wait();
  }

 private:
  UniqueFd to_;
  Child child_;
};

// What the target answered, if it failed (within `limit` of the stream breaking).
std::optional<Error> target_failure(Connection& c, const std::string& where,
                                    std::chrono::seconds limit = std::chrono::seconds(10)) {
  try {
    const auto line =
        read_answer(c.out(), std::chrono::steady_clock::now() + limit, "the target " + where);
    const auto f = migrate_wire::failure_of(line ? json::parse(*line, nullptr, false) : json());
    if (!f) return std::nullopt;
    return Error(f->code, "the restore on " + where +
                              " failed: " + (f->message.empty() ? *line : f->message));
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The target's first line: its gpuckpt runs, its spool is ready, and it is reading the stream;
// with its GPUs (`gpuckpt --json devices`). Anything else fails the migration before anything
// is frozen.
json await_receiving(Connection& c, const MigrateOptions& o, const std::string& where) {
  // A document over several lines when the target's gpuckpt failed (gpuckpt --json's error).
  const auto line = read_answer(
      c.out(), std::chrono::steady_clock::now() + std::chrono::seconds(60), "the target " + where);
  json j;
  if (line) j = json::parse(*line, nullptr, false);
  if (line && migrate_wire::is_receiving(j)) return j;
  std::string why;
  Errc code = Errc::kIo;
  if (!line) {
    why = "ssh: " + c.wait(std::chrono::seconds(10)).describe();
  } else if (const auto f = migrate_wire::failure_of(j)) {
    // The target refused (a missing mount source, a bad option): its reason, with its code.
    why = f->message.empty() ? *line : f->message;
    code = f->code;
  } else {
    why = "it answered: " + line->substr(0, 300);
  }
  throw Error(code, "cannot run " + o.remote_gpuckpt + " restore on " + where + " (" + why +
                        "); nothing was frozen");
}

}  // namespace

MigrateResult migrate_over_ssh(const MigrateOptions& o, const ContainerMove* box) {
  const remote::SshTarget t = remote::parse_ssh_url(o.to_dir.string());
  const std::string where = t.str();
  const auto ssh = remote::ssh_command(t, o.ssh_config);
  MigrateResult res;
  res.old_pid = o.pid;
  res.target = where;
  res.handoff =
      o.handoff == MigrateHandoff::kRelease ? MigrateHandoff::kRelease : MigrateHandoff::kFrozen;
  const bool release = res.handoff == MigrateHandoff::kRelease;

  // Before anything is frozen: one connection to the target, whose gpuckpt is then ready to
  // receive (ssh's handshake and its start are not frozen time), with GPUs there for the ones
  // used here. The checkpoint goes out over it while it is written (remote/ssh.h).
  std::set<std::string> used;
  for (pid_t q : process_tree(o.pid))
    for (auto& u : nvidia_gpu_uuids(q)) used.insert(std::move(u));
  auto argv = ssh;
  argv.push_back(remote_restore_command(o, release, box));
  std::optional<Connection> conn;
  {
    auto scope = res.timeline.scope(stage::kTargetPreflight);
    conn.emplace(argv);
    const json ready = await_receiving(*conn, o, where);
    if (!used.empty()) {
      const json devices = ready.value("devices", json::object());
      check_target_gpus(used, devices, o.gpu_map, where,
                        device::nvml_process_memory(process_tree(o.pid)));
      check_target_driver(devices, where, device::kernel_module_version());
    }
  }

  Guard guard("migrate");
  // A release's rollback restores the original here under its ID: held against another restore
  // until the migration is over.
  if (box && release) guard.lock_container_restore(box->plan.record.root, box->box.id);
  const fs::path spool_root = remote::spool_root(o.spool_root);
  TempDir spool = make_staging(spool_root, "gpuckpt-dump-spool");
  guard.remove_on_recovery(spool.path());
  res.checkpoint = spool.path() / "checkpoint";

  remote::StreamSender sender(conn->in());
  // The local copy is what a release's rollback restores, so it must be durable; a frozen
  // original is simply resumed, and its spool is only a transit copy.
  const image::PackCopy copy{&sender, release || o.keep_checkpoint};
  std::optional<DumpOutcome> dumped;
  try {
    // On failure the original already runs again; the target sees its stream end early.
    dumped = dump_keep_stopped(migration_dump(o, res.checkpoint), guard, copy,
                               box ? &box->plan : nullptr);
  } catch (...) {
    // A target whose restore failed stopped reading, which failed the dump: its answer says why.
    // A dump that failed here (CRIU, the disk) has nothing to wait for there.
    const auto why = sender.failed() ? target_failure(*conn, where) : std::nullopt;
    conn->close();
    rethrow_with_context("migration to " + where + " failed: " +
                             (why ? std::string(why->what()) + "; so: " : std::string()),
                         "");
  }
  res.timeline.append(dumped->result.timeline);
  res.image_bytes = dumped->result.image_bytes;
  res.checkpoint_bytes = dumped->result.checkpoint_bytes;
  res.adaptive_compression = compression_adapts(o.pack.compression, true);
  res.skipped_compression_bytes = dumped->result.skipped_compression_bytes;

  json answer;
  try {
    if (release) release_original(o, *dumped, res.checkpoint, guard, res.timeline, box);
    fault_point(fault::kTransfer);
    // The manifest, then what is still unsent (all of it, if the dump was staged).
    std::uint64_t sent = 0;
    try {
      sent = sender.finish(res.checkpoint, o.pack.progress, o.stall_timeout);
    } catch (const Error&) {
      // A target whose restore failed stops reading: its answer says why. A stalled one may
      // have said something too, or nothing: a short look.
      const auto limit = sender.failed() ? std::chrono::seconds(10) : std::chrono::seconds(2);
      if (auto why = target_failure(*conn, where, limit)) throw *why;
      throw;
    }
    const auto t1 = Timeline::Clock::now();
    res.timeline.add(stage::kTransfer, sender.first_byte(), t1, sent);
    // The target restores and probes: bounded by its probe, plus CRIU's own bound.
    const auto deadline = std::chrono::steady_clock::now() + o.probe.timeout + o.criu.timeout;
    const auto line = read_answer(conn->out(), deadline, "the target " + where);
    const auto answered = Timeline::Clock::now();
    if (!line) {
      const ExitStatus st = conn->wait(std::chrono::seconds(10));
      throw Error(Errc::kIo, "the connection to " + where + " ended before the target answered (" +
                                 st.describe() + ")");
    }
    try {
      answer = json::parse(*line);
    } catch (const json::exception&) {
      throw Error(Errc::kIo, "the target " + where + " answered: " + line->substr(0, 300));
    }
    if (const auto f = migrate_wire::failure_of(answer))
      throw Error(f->code, "the restore on " + where +
                               " failed: " + (f->message.empty() ? *line : f->message));
    if (!answer.is_object() || !answer.value("ok", false))
      throw Error(Errc::kIo, "the target " + where + " answered: " + line->substr(0, 300));
    res.timeline.add(stage::kTargetRestore, t1, answered);
    add_target_stages(res.timeline, answer, answered);
    fault_point(fault::kCommit);
    // Commit: the target keeps its copy once it reads this line, and exits 0. From before the
    // write: an interrupt after it must not roll back what the target may already keep.
    res.committed = std::make_shared<const CommitScope>();
    migrate_wire::send_commit(conn->in(), where);
    const ExitStatus st = conn->wait(std::chrono::seconds(60));
    if (!st.ok())
      throw Error(Errc::kIo, "the target " + where + " did not confirm the commit (" +
                                 st.describe() +
                                 "): it kills its copy unless it read the commit line before the "
                                 "connection failed; look there before restarting the service "
                                 "here");
  } catch (...) {
    // Not committed after all: an interrupt deferred meanwhile is one again, and rolls back.
    res.committed.reset();
    raise_deferred_interrupt();
    conn->close();  // the target kills an uncommitted copy when its input closes
    const std::string undone = guard.abort();
    rethrow_with_context("migration to " + where + " failed: ", "\nrollback: " + undone);
  }
  // The copy serves on the target: the original may end, and the guard is told so first, so that
  // gpuckpt stopped from here on ends it too (or, released already, does not restore it).
  guard.hand_over(/*end_original=*/!release);
  if (!release) end_original(*dumped, box, res.timeline);
  guard.disarm();
  if (o.keep_checkpoint) {
    // Out of the spool, which the next run would sweep: beside it, under --spool.
    const fs::path kept = spool_root / checkpoint_name(dumped->record.comm, o.pid);
    std::error_code ec;
    fs::rename(res.checkpoint, kept, ec);
    if (ec)
      spdlog::warn("cannot keep the checkpoint at {}: {}", kept.string(), ec.message());
    else
      res.checkpoint = kept;
  }
  res.new_pid = answer.value("pid", 0);
  res.first_answer = answer.value("first_answer", std::string());
  res.huge_page_bytes = answer.value("huge_page_bytes", std::uint64_t{0});
  res.target_result = std::move(answer);
  return res;
}

}  // namespace gpuckpt::process
