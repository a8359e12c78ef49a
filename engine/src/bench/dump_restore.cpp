// gpuckpt::bench_dump_restore(): one process dumped and restored three ways on the same disk,
// side by side (docs/PERFORMANCE.md, "Streaming dump and restore"): gpuckpt streaming, gpuckpt
// staged through tmpfs, and plain `criu dump -D DIR` / `criu restore -D DIR`. Each dump and
// restore runs as a child process, so that its peak RSS and that of everything it starts
// (criu, the guard) can be sampled, together with what it puts in the staging tmpfs.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "container/checkpoint.h"
#include "container/runtime.h"
#include "criu/criu.h"
#include "gpuckpt/bench.h"
#include "gpuckpt/error.h"
#include "gpuckpt/process.h"
#include "gpuckpt/support.h"
#include "image/transfer_common.h"
#include "probe/probe.h"
#include "process/proc_info.h"
#include "process/support.h"
#include "util/fs.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace {

using Clock = std::chrono::steady_clock;

struct Sampled {
  double seconds = 0;       // until the command exited
  std::uint64_t extra = 0;  // sum of peak RSS of the command's tree + peak staging bytes
  ExitStatus status;
};

// A gpuckpt rolls its operation back on SIGINT (its guard may take up to 120 s:
// cli/signals.cpp) and plain criu lets its tasks go; the group is killed only if that does not
// end its leader. Whether SIGINT sufficed.
bool interrupt_command(pid_t leader) {
  ::kill(-leader, SIGINT);
  if (process::wait_ended(leader, std::chrono::seconds(125))) return true;
  ::kill(-leader, SIGKILL);
  return false;
}

// runc ARGS under its default root; its output, or Error(kProcess) (Error(kTimeout) past
// `timeout`).
std::string runc(std::vector<std::string> args,
                 std::chrono::seconds timeout = std::chrono::seconds(60)) {
  args.insert(args.begin(), {container::runc_binary().string(), "--root", container::kRuncRoot});
  const auto r = run_capture(args, timeout);
  if (!r.status.ok())
    throw Error(Errc::kProcess,
                "runc " + args[3] + " failed (" + r.status.describe() + "): " + r.output);
  return r.output;
}

// What the benchmark has running, for an interrupt: its commands run in process groups of their
// own (a Ctrl-C does not reach them), and its demo server in a session of its own. Shared with
// the OnInterrupt hook, which runs on the signal-handling thread.
struct InFlight {
  std::mutex mu;
  pid_t command = 0;      // a dump or restore, the leader of its process group
  pid_t server = 0;       // the demo server, or its bare restored copy (the same pid)
  std::string container;  // the runc container the demo server runs in, if any
  std::vector<fs::path> scratch;
  bool interrupted = false;

  // Once interrupted, the benchmark's thread runs on until gpuckpt dies of the signal: what it
  // starts meanwhile is ended at once.
  void set_command(pid_t p) {
    std::lock_guard lk(mu);
    command = p;
    if (interrupted && p > 0) ::kill(-p, SIGINT);  // a gpuckpt rolls back; criu lets go
  }
  void set_server(pid_t p) {
    std::lock_guard lk(mu);
    server = p;
    if (interrupted && p > 0) ::kill(p, SIGKILL);  // our child, just started
  }
  // The command gets the interrupt itself: a gpuckpt rolls its operation back (its guard) and
  // plain criu lets its tasks go. Then the server, or the copy a restore left, is killed, and
  // the scratch files are removed.
  std::string interrupt() {
    std::lock_guard lk(mu);
    interrupted = true;
    std::vector<std::string> said;
    if (command > 0 && process::alive(command)) {
      said.push_back("its command (pid " + std::to_string(command) +
                     (interrupt_command(command)
                          ? ") was interrupted"
                          : ") did not end within 125 s of SIGINT and was killed"));
    }
    // The server (its own session), or the copy a restore left with its pid; a criu restore
    // still in flight names it "criu", and was interrupted above.
    if (const auto p = server > 0 ? process::read_proc(server) : std::nullopt;
        p && p->state != 'Z' && p->comm.starts_with("gpuckpt-demo")) {
      const auto left = process::end_tree(process::process_tree(server), 10000);
      said.push_back("its demo server " + std::to_string(server) +
                     (left.empty() ? " was ended" : " is still there after SIGKILL"));
    }
    if (!container.empty()) {
      // Its init, restored, has a host pid of its own: runc ends whatever runs under the ID.
      // Nothing may escape this hook (the signal thread calls it): a runc that cannot be run
      // or does not answer is said instead.
      try {
        runc({"delete", "--force", container}, std::chrono::seconds(30));
        said.push_back("its container " + container + " was deleted");
      } catch (const std::exception& e) {
        said.push_back("its container " + container + " was not deleted: " + e.what());
      }
    }
    std::error_code ec;
    for (const fs::path& f : scratch)
      if (fs::remove_all(f, ec) > 0) said.push_back("removed " + f.string());
    std::string out;
    for (const auto& s : said) out += (out.empty() ? "the benchmark: " : "; ") + s;
    return out;
  }
};

// Runs argv to completion, sampling every few ms the peak RSS (VmHWM) of it and its
// descendants (`exclude`: the process being restored, which is criu's child meanwhile) and the
// bytes in `staging`. Its output goes to `out_file`, its standard output to `json_file` instead
// where one is given.
Sampled run_sampled(const std::vector<std::string>& argv, const fs::path& staging, pid_t exclude,
                    const fs::path& out_file, std::chrono::seconds timeout, InFlight& flight,
                    const fs::path& json_file = {}) {
  // A container's restored tasks take new host pids in a pid namespace of their own: the
  // memory they restore is the process's, never the method's extra.
  const auto own_pidns = process::pid_namespace_inode(::getpid());
  SpawnOptions so;
  so.stdout_file = json_file.empty() ? out_file : json_file;
  so.stderr_file = out_file;
  so.new_process_group = true;
  Sampled s;
  const auto t0 = Clock::now();
  // What the staging tmpfs already holds is not this run's.
  const std::uint64_t staged_before = allocated_bytes(staging);
  Child c = spawn(argv, so);
  flight.set_command(c.pid());
  // However this returns: an interrupt must not later signal the pid once it is reaped (and
  // maybe reused).
  struct Forget {
    InFlight& flight;
    ~Forget() { flight.set_command(0); }
  } forget{flight};
  std::map<pid_t, std::uint64_t> peak;
  std::uint64_t staged = staged_before;
  std::optional<ExitStatus> st;
  while (!(st = c.wait_for(std::chrono::milliseconds(2)))) {
    try {  // a process exiting while /proc is read: skip this sample
      for (pid_t p : process::process_tree(c.pid()))
        if (p != exclude && process::pid_namespace_inode(p) == own_pidns)
          peak[p] = std::max(peak[p], process::peak_rss_bytes(p));
    } catch (const std::exception&) {
    }
    staged = std::max(staged, allocated_bytes(staging));
    if (Clock::now() - t0 > timeout) {
      // Interrupted like a Ctrl-C, not killed: a killed gpuckpt would leave its rollback to its
      // guard, and the benchmark's next step would race it.
      const bool rolled_back = interrupt_command(c.pid());
      c.wait();
      throw Error(Errc::kTimeout,
                  argv[0] + " did not finish within " + std::to_string(timeout.count()) +
                      " s, and " +
                      (rolled_back ? "was interrupted" : "was killed 125 s after SIGINT"));
    }
  }
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  s.status = *st;
  for (const auto& [p, v] : peak) s.extra += v;
  s.extra += staged - staged_before;
  return s;
}

// The page cache must not serve a restore what the dump just wrote: every method reads from
// the disk. Targeted (POSIX_FADV_DONTNEED on these files) rather than drop_caches.
void evict(const fs::path& dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    UniqueFd fd(::open(it->path().c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) continue;
    ::fdatasync(fd.get());
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }
}

// Everything CRIU wrote, made durable, as gpuckpt's checkpoints are: plain CRIU does not fsync.
void sync_dir(const fs::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) ::syncfs(fd.get());
}

// `process_end_seconds` of a `gpuckpt --json dump` result.
double dump_process_end_seconds(const fs::path& json) {
  const std::string text = read_file(json);
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("process_end_seconds") || !j["process_end_seconds"].is_number())
    throw Error(Errc::kInternal, "gpuckpt dump's result has no process_end_seconds: " + text);
  return j["process_end_seconds"].get<double>();
}

// A runc bundle for the demo server, under runc's default root (where gpuckpt looks): a rootfs
// of mount points with the host's /usr, and the benchmark directory and the server's own
// directory bound in at their paths (its weights and its socket); its own pid, mount, ipc and
// uts namespaces and the host's network; runc's default spec without the rlimits root may not
// raise here.
// `dir`, `weights` and `sock` are absolute: the server starts in the container's /.
fs::path make_bundle(const fs::path& dir, const fs::path& weights, const fs::path& sock) {
  const fs::path bundle = dir / "bench-bundle", rootfs = bundle / "rootfs";
  fs::remove_all(bundle);
  for (const char* d : {"usr", "proc", "dev", "sys", "tmp", "etc"})
    fs::create_directories(rootfs / d);
  for (const char* l : {"bin", "lib", "lib64", "sbin"})
    fs::create_symlink(fs::path("usr") / l, rootfs / l);
  SpawnOptions so;
  so.cwd = bundle;
  if (const auto r =
          run_capture({container::runc_binary().string(), "spec"}, std::chrono::seconds(30), so);
      !r.status.ok())
    throw Error(Errc::kProcess, "runc spec failed: " + r.output);
  nlohmann::json spec = nlohmann::json::parse(read_file(bundle / "config.json"));
  spec["process"]["terminal"] = false;
  spec["process"]["args"] = {(self_exe_dir() / "gpuckpt-demo-server").string(), "--socket",
                             sock.string(), "--weights", weights.string()};
  spec["process"].erase("rlimits");
  spec["root"]["readonly"] = false;
  auto& ns = spec["linux"]["namespaces"];
  ns.erase(std::remove_if(ns.begin(), ns.end(),
                          [](const nlohmann::json& n) { return n.value("type", "") == "network"; }),
           ns.end());
  auto bind = [&](const fs::path& p, bool ro) {
    fs::create_directories(rootfs / p.relative_path());
    spec["mounts"].push_back(
        {{"destination", p.string()},
         {"type", "bind"},
         {"source", p.string()},
         {"options", ro ? nlohmann::json{"rbind", "ro"} : nlohmann::json{"rbind", "rw"}}});
  };
  bind("/usr", true);
  bind(dir, false);
  if (!image::is_within(self_exe_dir(), "/usr") && !image::is_within(self_exe_dir(), dir))
    bind(self_exe_dir(), true);
  write_file_atomic(bundle / "config.json", spec.dump(1));
  return bundle;
}

// The demo server, answering on a unix socket in the benchmark directory: a child of the
// benchmark, or the init of runc container `id` of `bundle`.
class Server {
 public:
  Server(const fs::path& dir, const fs::path& weights, InFlight& flight,
         const fs::path& bundle = {}, const std::string& id = {})
      : sock_(dir / "bench.sock"), id_(id) {
    const fs::path log = dir / "bench-server.log";
    fs::remove(log);
    fs::remove(sock_);
    SpawnOptions so;
    so.stdout_file = log;
    so.stderr_file = log;
    so.new_session = true;  // no terminal: CRIU dumps it without --shell-job
    if (id_.empty()) {
      child_ = spawn({(self_exe_dir() / "gpuckpt-demo-server").string(), "--socket", sock_.string(),
                      "--weights", weights.string()},
                     so);
      pid_ = child_.pid();
    } else {
      remove_container();  // what an earlier run left
      // Its stdio on /dev/null, which CRIU opens again by path: a host file would be one opened
      // outside the container's mounts. runc's own errors go to its log.
      so.cwd = bundle;
      so.stdout_file = so.stderr_file = "/dev/null";
      Child run = spawn({container::runc_binary().string(), "--root", container::kRuncRoot, "--log",
                         fs::absolute(log).string(), "run", "--detach", id_},
                        so);
      // A destructor does not run for a constructor that throws: the container goes here.
      try {
        if (const auto st = run.wait_for(std::chrono::seconds(60)); !st || !st->ok())
          throw Error(Errc::kProcess, "runc run of the demo server failed: " + read_file(log));
        pid_ = container::find(id_).init_pid;
        await_ready(flight, log);
      } catch (...) {
        remove_container();
        throw;
      }
      return;
    }
    await_ready(flight, log);
  }
  ~Server() {
    if (!id_.empty()) remove_container();
  }
  pid_t pid() const { return pid_; }
  const fs::path& socket() const { return sock_; }
  // Waits for the dumped server to end (its dump ends it).
  void await_dumped() {
    if (id_.empty())
      child_.wait_for(std::chrono::seconds(60));
    else
      process::wait_ended(pid_, std::chrono::seconds(60));
  }
  // Asks the restored server to quit and waits until it has.
  void quit() {
    const pid_t restored = id_.empty() ? pid_ : container::find(id_).init_pid;
    ask_unix_line(sock_, "QUIT");
    process::wait_ended(restored, std::chrono::seconds(30));
  }

 private:
  void await_ready(InFlight& flight, const fs::path& log) {
    flight.set_server(pid_);  // while it loads its weights too
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    while (ask_unix_line(sock_, "PING") != "PONG") {
      if (!process::alive(pid_))
        throw Error(Errc::kProcess, "the demo server exited: " + read_file(log));
      if (Clock::now() > deadline) throw Error(Errc::kTimeout, "the demo server did not start");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void remove_container() noexcept {
    try {
      runc({"delete", "--force", id_});
    } catch (const Error&) {  // none by that ID
    }
  }

  fs::path sock_;
  std::string id_;
  Child child_;
  pid_t pid_ = 0;
};

}  // namespace

const char* bench_content_name(DumpRestoreBenchOptions::Content c) {
  return c == DumpRestoreBenchOptions::Content::kBf16 ? "bf16" : "mixed";
}

const char* bench_memory_name(DumpRestoreBenchOptions::Memory m) {
  return m == DumpRestoreBenchOptions::Memory::kWarm ? "warm" : "cold";
}

namespace {

// One benchmark's fixed parts, and the commands of each method.
struct Bench {
  const DumpRestoreBenchOptions& o;
  fs::path gpuckpt = fs::read_symlink("/proc/self/exe");
  criu::Installation inst = criu::locate(o.criu.binary);
  fs::path weights = o.dir / "bench-weights.bin";
  std::shared_ptr<InFlight> flight = std::make_shared<InFlight>();
  std::string id = "gpuckpt-bench-" + std::to_string(::getpid());  // the container's
  fs::path bundle;                                                 // the container's
  std::chrono::seconds timeout{1800};

  ~Bench() {
    std::error_code ec;
    if (!bundle.empty()) fs::remove_all(bundle, ec);  // whether the benchmark ended or failed
  }

  static bool plain(const std::string& method) { return method == "criu" || method == "runc"; }
  static std::string mode(const std::string& method) {
    return method == "staged" ? "staged" : "stream";
  }

  std::vector<std::string> runc(std::vector<std::string> args) const {
    args.insert(args.begin(), {container::runc_binary().string(), "--root", container::kRuncRoot,
                               "--criu", inst.binary.string()});
    return args;
  }

  // The dump of the server `pid` into `ckpt` by `method`; a gpuckpt's --json result goes to the
  // command's standard output.
  std::vector<std::string> dump_argv(const std::string& method, pid_t pid,
                                     const fs::path& ckpt) const {
    if (method == "criu")
      return {inst.binary.string(), "dump", "-t", std::to_string(pid), "-D", ckpt.string(), "-o",
              "dump.log",           "-v2"};
    if (method == "runc") return runc({"checkpoint", "--image-path", ckpt.string(), id});
    std::vector<std::string> argv{gpuckpt.string(), "--json", "dump"};
    if (o.container)
      argv.insert(argv.end(), {"--container", id});
    else
      argv.insert(argv.end(), {"--pid", std::to_string(pid)});
    argv.insert(argv.end(), {"-o", ckpt.string(), "--staging", o.staging_root.string(),
                             "--staging-mode", mode(method), "--no-criu-check"});
    return argv;
  }

  std::vector<std::string> restore_argv(const std::string& method, const fs::path& ckpt) const {
    if (method == "criu")
      return {inst.binary.string(), "restore", "-D", ckpt.string(), "-d", "-o",
              "restore.log",        "-v2"};
    if (method == "runc")
      return runc(
          {"restore", "--detach", "--image-path", ckpt.string(), "--bundle", bundle.string(), id});
    // A container's images stream into runc's CRIU as a bare process's do into gpuckpt's.
    std::vector<std::string> argv{
        gpuckpt.string(),        "restore",        ckpt.string(), "--staging",
        o.staging_root.string(), "--staging-mode", mode(method),  "--no-criu-check"};
    if (o.container) argv.push_back("--container");
    if (method == "stream-4k") argv.push_back("--no-huge-pages");
    return argv;
  }

  // The process just freed its memory, and how much of it its VM's host has taken back (free
  // page reporting) depends on the moment: each restore meets one known state.
  void meet_memory(std::uint64_t bytes) const {
    if (o.memory == DumpRestoreBenchOptions::Memory::kCold) {
      const double settled = settle_free_memory();
      if (o.log && settled > 0)
        o.log("waited " + format_seconds(settled) + " for free page reporting to settle");
    } else {
      const unsigned threads = usable_cpus();
      if (!touch_fresh_memory(bytes, true, threads))
        touch_fresh_memory(bytes, false, threads);  // no THP here
    }
  }

  // One run of `m`: a fresh server dumped, then restored until it answers with its weights.
  void run_once(DumpRestoreBenchMethod& m, unsigned run, DumpRestoreBenchResult& res) {
    Server srv(o.dir, weights, *flight, bundle, o.container ? id : std::string());
    const std::string weights_answer = ask_unix_line(srv.socket(), "WEIGHTS");
    res.process_bytes = process::dumpable_memory_bytes(srv.pid());
    const fs::path ckpt = o.dir / ("bench-" + m.name + ".ckpt");
    {
      std::lock_guard lk(flight->mu);
      flight->scratch = {weights, ckpt};
    }
    fs::remove_all(ckpt);
    const fs::path out = o.dir / ("bench-" + m.name + ".out");
    // What the steps before left for the disk to write (the weights just generated, the last
    // method's files) is written now, not during this dump: each meets the same quiet disk.
    sync_dir(o.dir);
    // gpuckpt's --json result says how long ending the dumped process took.
    const fs::path result = o.dir / ("bench-" + m.name + ".json");
    fs::remove(result);
    if (plain(m.name)) fs::create_directories(ckpt);
    Sampled d = run_sampled(dump_argv(m.name, srv.pid(), ckpt), o.staging_root, 0, out, timeout,
                            *flight, plain(m.name) ? fs::path() : result);
    if (plain(m.name)) {  // durable once synced, as gpuckpt's checkpoint is
      const auto t = Clock::now();
      sync_dir(ckpt);
      d.seconds += std::chrono::duration<double>(Clock::now() - t).count();
    }
    if (!d.status.ok())
      throw Error(Errc::kCriu, m.name + " dump failed (" + d.status.describe() + "): " +
                                   read_file(out) + (fs::exists(result) ? read_file(result) : ""));
    // Until the checkpoint was durable. Plain criu's images are once its syncfs returned;
    // gpuckpt ends the dumped process only after that, and the end comes off (its own exit, a
    // few ms, stays in).
    const double durable = plain(m.name)
                               ? d.seconds
                               : d.seconds - std::min(dump_process_end_seconds(result), d.seconds);
    fs::remove(result);
    srv.await_dumped();
    res.checkpoint_bytes[m.name] = tree_bytes(ckpt);
    evict(ckpt);
    meet_memory(res.process_bytes);

    // A bare restore brings the process back with its pid; a container's init takes a new host
    // pid (run_sampled leaves out what runs in its pid namespace).
    const auto t0 = Clock::now();
    Sampled r = run_sampled(restore_argv(m.name, ckpt), o.staging_root, o.container ? 0 : srv.pid(),
                            out, timeout, *flight);
    if (!r.status.ok())
      throw Error(Errc::kCriu,
                  m.name + " restore failed (" + r.status.describe() + "): " + read_file(out));
    // Until it answers, like gpuckpt restore --probe (which the gpuckpt runs do not use, so
    // that all are timed the same way).
    while (ask_unix_line(srv.socket(), "PING") != "PONG") {
      if (Clock::now() - t0 > std::chrono::seconds(120))
        throw Error(Errc::kTimeout, "the restored server does not answer");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (ask_unix_line(srv.socket(), "WEIGHTS") != weights_answer)
      throw Error(Errc::kCorrupt, m.name + ": the restored weights differ");
    srv.quit();
    flight->set_server(0);
    m.dump_seconds.push_back(durable);
    m.dump_exit_seconds.push_back(d.seconds);
    m.restore_seconds.push_back(r.seconds);
    m.dump_extra_bytes.push_back(d.extra);
    m.restore_extra_bytes.push_back(r.extra);
    if (o.log)
      o.log(m.name + " run " + std::to_string(run + 1) + ": dump " + std::to_string(durable) +
            " s to durable, " + std::to_string(d.seconds) + " s to exit, " +
            std::to_string(d.extra >> 20) + " MiB extra; restore " + std::to_string(r.seconds) +
            " s, " + std::to_string(r.extra >> 20) + " MiB extra");
    fs::remove_all(ckpt);
  }
};

void take_medians(DumpRestoreBenchMethod& m) {
  m.dump_median = median(m.dump_seconds);
  m.dump_exit_median = median(m.dump_exit_seconds);
  m.restore_median = median(m.restore_seconds);
  std::vector<double> de(m.dump_extra_bytes.begin(), m.dump_extra_bytes.end());
  std::vector<double> re(m.restore_extra_bytes.begin(), m.restore_extra_bytes.end());
  m.dump_extra_median = static_cast<std::uint64_t>(median(de));
  m.restore_extra_median = static_cast<std::uint64_t>(median(re));
}

}  // namespace

DumpRestoreBenchResult bench_dump_restore(const DumpRestoreBenchOptions& given) {
  if (given.dir.empty()) throw Error(Errc::kUsage, "no benchmark directory given");
  if (given.runs == 0) throw Error(Errc::kUsage, "at least one run");
  // Absolute: runc resolves its image path from the bundle, and the container's server from /.
  DumpRestoreBenchOptions o = given;
  o.dir = fs::absolute(given.dir);
  fs::create_directories(o.dir);
  Bench b{o};
  const OnInterrupt on_interrupt([flight = b.flight] { return flight->interrupt(); });
  {
    std::lock_guard lk(b.flight->mu);
    b.flight->scratch.push_back(b.weights);
  }
  {
    auto r = run_capture({(self_exe_dir() / "gpuckpt-demo-server").string(), "--generate-weights",
                          b.weights.string(), "--size", std::to_string(o.size), "--content",
                          bench_content_name(o.content)},
                         std::chrono::seconds(1800));
    if (!r.status.ok()) throw Error(Errc::kIo, "cannot generate the weights: " + r.output);
  }
  DumpRestoreBenchResult res;
  // stream-4k: streamed, restored with CRIU's own 4 KiB fill (--no-huge-pages), so that the
  // huge-page fill's share of the restore shows on its own. In a container: gpuckpt's
  // --container against runc's own checkpoint and restore with the same CRIU.
  if (o.container) {
    res.methods = {{"container"}, {"runc"}};
    b.bundle = make_bundle(o.dir, b.weights, o.dir / "bench.sock");
    std::lock_guard lk(b.flight->mu);
    b.flight->container = b.id;
  } else {
    res.methods = {{"stream"}, {"stream-4k"}, {"staged"}, {"criu"}};
  }
  for (unsigned run = 0; run < o.runs; ++run)
    for (auto& m : res.methods) b.run_once(m, run, res);
  fs::remove(b.weights);
  for (auto& m : res.methods) take_medians(m);
  return res;
}

}  // namespace gpuckpt
