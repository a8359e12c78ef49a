// Containers, with real runc, real CRIU and a redis server in a bundle the test makes (no
// registry reaches this machine): `dump --container` takes one whole, `restore --container`
// brings it back as a container runc lists, with its data (DEBUG DIGEST), once or as replicas
// beside each other; a signal at any phase of the dump leaves it running and known to runc; and
// what cannot be done is refused before anything is frozen. A process inside a container is
// named with its container, and a pid namespace no runtime made as such.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "container/checkpoint.h"
#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "process/pidns.h"
#include "process/proc_info.h"
#include "test_support.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr int kRedisPort = 6379;

class E2eContainer : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto runc = find_executable("runc");
    if (!runc) GTEST_SKIP() << "runc is not installed (scripts/setup.sh installs it)";
    if (!find_executable("redis-server") || !find_executable("redis-cli"))
      GTEST_SKIP() << "redis is not installed (scripts/setup.sh installs it)";
    runc_ = runc->string();
    root_ = dir_.path() / "runc-root";
    bundle_ = dir_.path() / "bundle";
    make_bundle();
    roots_.emplace("GPUCKPT_RUNC_ROOTS", root_.string());  // gpuckpt finds the test's runc
  }
  void TearDown() override {
    for (const auto& id : started_) {
      runc({"kill", id, "KILL"});
      runc({"delete", "--force", id});
    }
    for (auto& d : drains_) {
      d.kill(SIGKILL);
      d.wait();
    }
    for (const auto& id : started_) {
      std::error_code ec;
      test::remove_container_restore_dirs(id);
      fs::remove(fs::path("/var/log/gpuckpt/containers") / (id + ".log"), ec);
    }
  }

  // `runc list` under runc's default root (where gpuckpt bench makes its containers).
  std::string runc_list_default_root() {
    return run_capture({runc_, "--root", "/run/runc", "list"}, 60s).output;
  }

  RunResult runc(std::vector<std::string> args) {
    args.insert(args.begin(), {runc_, "--root", root_.string()});
    SpawnOptions o;
    o.stderr_file = dir_.path() / "runc.err";
    return run_capture(args, 60s, o);
  }

  // A rootfs of empty mount points and the host's /usr (read-only), with the links of a merged
  // /usr; runc's default spec (its own pid, mount, ipc, uts and network namespaces), without the
  // rlimits that root here may not raise.
  void make_bundle() {
    const fs::path rootfs = bundle_ / "rootfs";
    for (const char* d : {"usr", "proc", "dev", "sys", "tmp", "etc"})
      fs::create_directories(rootfs / d);
    for (const char* l : {"bin", "lib", "lib64", "sbin"})
      fs::create_symlink(fs::path("usr") / l, rootfs / l);
    SpawnOptions o;
    o.cwd = bundle_;
    ASSERT_TRUE(run_capture({runc_, "spec"}, 30s, o).status.ok());
    json spec = json::parse(read_file(bundle_ / "config.json"));
    spec["process"]["terminal"] = false;
    spec["process"]["args"] = {
        "/usr/bin/redis-server", "--port", std::to_string(kRedisPort), "--save", "",
        "--appendonly",          "no",     "--enable-debug-command",   "yes"};
    spec["process"].erase("rlimits");
    spec["root"]["readonly"] = false;
    spec["mounts"].push_back({{"destination", "/usr"},
                              {"type", "bind"},
                              {"source", "/usr"},
                              {"options", {"rbind", "ro"}}});
    std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  }

  // runc ARGS that leaves a process running with runc's own stdio (run or exec --detach): into
  // files, so that no pipe of ours stays open in the container.
  ExitStatus runc_detached(std::vector<std::string> args) {
    args.insert(args.begin(), {runc_, "--root", root_.string()});
    SpawnOptions o;
    o.cwd = bundle_;
    o.stdout_file = dir_.path() / "container.out";
    o.stderr_file = dir_.path() / "runc.err";
    Child c = spawn(args, o);
    if (auto st = c.wait_for(60s)) return *st;
    c.kill(SIGKILL);
    return c.wait();
  }

  // Starts container `id` (detached) and returns its init's host pid. Its stdout and stderr
  // are a pipe that a process of the test drains, as a runtime's shim does (`files`: runc's
  // own, a host file).
  pid_t run_container(const std::string& id, bool files = false) {
    ExitStatus st;
    if (files) {
      st = runc_detached({"run", "--detach", id});
    } else {
      UniqueFd feed = drained_pipe(id);
      SpawnOptions o;
      o.cwd = bundle_;
      o.stdout_fd = feed.get();
      o.stderr_fd = feed.get();
      Child c = spawn({runc_, "--root", root_.string(), "run", "--detach", id}, o);
      feed.reset();
      st = c.wait_for(60s).value_or(ExitStatus{});
    }
    EXPECT_TRUE(st.ok()) << st.describe() << read_file(dir_.path() / "runc.err");
    started_.push_back(id);
    const pid_t init = pid_of(id);
    EXPECT_TRUE(test::wait_until([&] { return redis(init, {"PING"}) == "PONG"; }));
    return init;
  }

  // The write end of a pipe that a process of the test drains into DIR/ID.log, as a runtime's
  // shim drains a container's output.
  UniqueFd drained_pipe(const std::string& id) {
    int ends[2];
    EXPECT_EQ(::pipe2(ends, O_CLOEXEC), 0);
    UniqueFd drain(ends[0]), feed(ends[1]);
    SpawnOptions d;
    d.stdin_fd = drain.get();
    d.stdout_file = dir_.path() / (id + ".log");
    drains_.push_back(spawn({"cat"}, d));
    return feed;
  }

  // The host pid of container `id`'s init, as runc says; 0 if runc has no running container.
  pid_t pid_of(const std::string& id) {
    const json state = json::parse(runc({"state", id}).output, nullptr, false);
    if (!state.is_object() || state.value("status", "") != "running") return 0;
    return state.value("pid", 0);
  }

  // redis-cli ARGS inside the network namespace of `pid`; its answer without the newline.
  static std::string redis(pid_t pid, std::vector<std::string> args) {
    args.insert(args.begin(), {"nsenter", "--net=/proc/" + std::to_string(pid) + "/ns/net",
                               "redis-cli", "-p", std::to_string(kRedisPort)});
    try {
      std::string out = run_capture(args, 30s).output;
      while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
      return out;
    } catch (const Error&) {
      return {};
    }
  }

  // What redis answers DEBUG DIGEST with from inside network namespace `ns` (a pod's).
  static std::string digest_in(const test::NetNs& ns) {
    return run_capture(ns.wrap({"redis-cli", "-p", std::to_string(kRedisPort), "DEBUG", "DIGEST"}),
                       30s)
        .output;
  }

  // Some data in the container's redis, and its digest.
  static std::string fill(pid_t pid) {
    for (int i = 0; i < 200; ++i)
      redis(pid,
            {"SET", "key:" + std::to_string(i), std::string(512, static_cast<char>('a' + i % 26))});
    return redis(pid, {"DEBUG", "DIGEST"});
  }

  // The bundle's spec, joining `pod`'s network namespace by its bind mount, and its ipc and uts
  // ones by its sandbox's pid. runc would name the pod's uts namespace after the container (its
  // default spec's hostname), which a container that joins its pod's does not.
  json in_pod(const test::PodSandbox& pod) {
    json spec = json::parse(read_file(bundle_ / "config.json"));
    for (auto& ns : spec["linux"]["namespaces"]) {
      const std::string type = ns.value("type", "");
      if (type == "network") ns["path"] = pod.netns_path();
      if (type == "ipc" || type == "uts") ns["path"] = pod.ns_path(type);
    }
    spec.erase("hostname");
    return spec;
  }

  // A checkpoint of container `id` that leaves it running (a snapshot), at DIR/`name`; empty,
  // the failure reported, if the dump failed.
  fs::path snapshot(const std::string& id, const std::string& name) {
    const fs::path ckpt = dir_.path() / name;
    const auto d =
        test::run_cli({"dump", "--container", id, "-o", ckpt.string(), "--leave-running"});
    if (d.exit_code == 0) return ckpt;
    ADD_FAILURE() << "the snapshot of " << id << " failed: " << d.err;
    return {};
  }

  std::string unique_id(const std::string& tag) {
    return "gk-" + tag + "-" + std::to_string(::getpid());
  }

  // A container named after `tag`, serving redis with some data: its ID, init, data's digest.
  struct Serving {
    std::string id;
    pid_t init = 0;
    std::string digest;
  };
  Serving serving(const std::string& tag) {
    Serving s{unique_id(tag)};
    s.init = run_container(s.id);
    if (s.init > 0) s.digest = fill(s.init);
    return s;
  }

  TempDir dir_ = test::scratch_dir("gpuckpt-e2e-container");
  std::string runc_;
  fs::path root_, bundle_;
  std::vector<std::string> started_;
  std::vector<Child> drains_;
  std::optional<test::ScopedEnv> roots_;
};

}  // namespace

// The issue's first report: a redis in a plain runc container was refused as a process "a
// `restore --new-pidns` or a frozen-handoff migration put there", which nobody had run.
TEST_F(E2eContainer, ADumpOfAProcessInAContainerNamesTheContainerAndFreezesNothing) {
  const std::string id = "gk-" + std::to_string(::getpid());
  const pid_t init = run_container(id);
  ASSERT_GT(init, 0);
  // A second process inside it, beside its init.
  ASSERT_TRUE(runc_detached({"exec", "--detach", id, "/usr/bin/sleep", "999"}).ok());
  pid_t inner = 0;
  ASSERT_TRUE(test::wait_until([&] {
    for (pid_t q : process::live_pids_where([&](const process::ProcInfo& p) {
           return p.pid != init && p.comm == "sleep" &&
                  process::pid_namespace_inode(p.pid) == process::pid_namespace_inode(init);
         }))
      inner = q;
    return inner > 0;
  }));
  const fs::path out = dir_.path() / "c.ckpt";
  for (const pid_t q : {init, inner}) {
    SCOPED_TRACE(q == init ? "its init" : "a process under it");
    const auto r =
        test::run_cli({"--json", "dump", "--pid", std::to_string(q), "-o", out.string()});
    EXPECT_EQ(r.exit_code, 10) << r.err;
    const json j = json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.out;
    const std::string msg = j["error"].value("message", "");
    EXPECT_NE(msg.find("runs in the runc container " + id), std::string::npos) << msg;
    EXPECT_EQ(msg.find("as its init") != std::string::npos, q == init) << msg;
    EXPECT_EQ(msg.find("its init is pid " + std::to_string(init)) != std::string::npos, q == inner)
        << msg;
    EXPECT_NE(msg.find("`gpuckpt dump --container '" + id + "'`"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("--new-pidns"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Nothing was frozen"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(test::process_state(q), 'S');
  }
  // runc still knows it as running.
  const json state = json::parse(runc({"state", id}).output, nullptr, false);
  ASSERT_TRUE(state.is_object());
  EXPECT_EQ(state.value("status", ""), "running");
}

class E2eCrun : public E2eContainer {
 protected:
  void SetUp() override {
    E2eContainer::SetUp();
    if (IsSkipped()) return;
    crun_root_ = dir_.path() / "crun-root";
    roots_.reset();
    roots_.emplace("GPUCKPT_RUNC_ROOTS", root_.string() + ":" + crun_root_.string());
    // crun's cgroupfs manager here may not raise RLIMIT_MEMLOCK for a devices program.
    json spec = json::parse(read_file(bundle_ / "config.json"));
    spec["linux"].erase("resources");
    std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  }
  void TearDown() override {
    for (const auto& id : crun_started_) {
      crun_do(crun_, {"delete", "--force", id});
      std::error_code ec;
      test::remove_container_restore_dirs(id);
      fs::remove(fs::path("/var/log/gpuckpt/containers") / (id + ".log"), ec);
    }
    crun_started_.clear();
    E2eContainer::TearDown();
  }

  // crun ARGS under the test's crun root, as on a cgroup v2 host; its output (and that of a
  // container it starts) into `out`, or into files: no pipe of the test's stays open in it.
  ExitStatus crun_do(const fs::path& crun, std::vector<std::string> args, int out = -1) {
    args.insert(args.begin(), {crun.string(), "--root", crun_root_.string()});
    SpawnOptions o;
    o.cwd = bundle_;
    if (out >= 0) {
      o.stdout_fd = out;
      o.stderr_fd = out;
    } else {
      o.stdout_file = dir_.path() / "crun.out";
      o.stderr_file = dir_.path() / "crun.err";
    }
    Child c = spawn(test::on_cgroup2(args), o);
    if (auto st = c.wait_for(60s)) return *st;
    c.kill(SIGKILL);
    return c.wait();
  }

  // Starts crun container `id` with `crun` and `manager` (its cgroup manager), its stdout and
  // stderr a pipe that a process of the test drains, as a runtime's shim does. Its init's pid.
  pid_t run_crun(const fs::path& crun, const std::string& id, const std::string& manager) {
    const UniqueFd feed = drained_pipe(id);
    crun_ = crun;  // any crun deletes what another started
    crun_started_.push_back(id);
    const ExitStatus st =
        crun_do(crun, {"--cgroup-manager=" + manager, "run", "--detach", id}, feed.get());
    EXPECT_TRUE(st.ok()) << st.describe() << read_file(dir_.path() / (id + ".log"));
    return crun_pid(id);
  }

  // The crun that can checkpoint and restore (container::crun_binary); nullopt, and why in
  // `no_crun_`, where there is none.
  std::optional<fs::path> criu_crun() {
    try {
      return container::crun_binary();
    } catch (const Error& e) {
      no_crun_ = e.what();
      return std::nullopt;
    }
  }

  // A redis with data in a crun container of `crun` with cgroups of its own (crun's cgroupfs
  // manager), as serving() makes one in runc's.
  Serving crun_serving(const std::string& tag, const fs::path& crun) {
    Serving s{unique_id(tag)};
    s.init = run_crun(crun, s.id, "cgroupfs");
    if (s.init > 0 && test::wait_until([&] { return redis(s.init, {"PING"}) == "PONG"; }))
      s.digest = fill(s.init);
    return s;
  }

  // The init of crun container `id` as crun's state has it; 0 if it has none.
  pid_t crun_pid(const std::string& id) {
    std::error_code ec;
    if (!fs::exists(crun_root_ / id / "status", ec)) return 0;
    const json status = json::parse(read_file(crun_root_ / id / "status"), nullptr, false);
    return status.is_object() ? status.value("pid", 0) : 0;
  }

  // gpuckpt ARGS, as on a cgroup v2 host.
  test::CliResult cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv{test::gpuckpt_binary().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    SpawnOptions o;
    o.stderr_file = dir_.path() / "cli.err";
    test::CliResult r;
    const RunResult rr = run_capture(test::on_cgroup2(argv), 300s, o);
    r.exit_code = rr.status.exited ? rr.status.code : 128 + rr.status.code;
    r.out = rr.output;
    r.err = read_file(o.stderr_file);
    return r;
  }

  fs::path crun_root_, crun_;
  std::string no_crun_;
  std::vector<std::string> crun_started_;
};

// A crun container, cgroups of its own (crun's cgroupfs manager): `dump --container` takes it
// whole, and `restore --container` brings it back as a container crun lists, with its data,
// through crun's own restore (its libcriu running gpuckpt's CRIU on the streamed images); then
// a replica beside it, in a network namespace of its own, on the same port.
TEST_F(E2eCrun, ACrunContainerComesBackAsACrunContainerWithItsData) {
  const auto crun = criu_crun();
  if (!crun) GTEST_SKIP() << no_crun_;
  const auto [id, init, digest] = crun_serving("crun", *crun);
  ASSERT_GT(init, 0);
  ASSERT_EQ(digest.size(), 40u) << digest;

  // A process inside is named with its container, and the command that takes it whole.
  const auto byp = cli(
      {"--json", "dump", "--pid", std::to_string(init), "-o", (dir_.path() / "p.ckpt").string()});
  EXPECT_EQ(byp.exit_code, 10) << byp.err;
  EXPECT_NE(byp.out.find("runs in the crun container " + id + " (crun root " + crun_root_.string() +
                         "), as its init"),
            std::string::npos)
      << byp.out;
  EXPECT_NE(byp.out.find("gpuckpt dump --container '" + id + "'"), std::string::npos) << byp.out;

  const fs::path ckpt = dir_.path() / "c.ckpt";
  auto d = cli({"--json", "dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(json::parse(d.out, nullptr, false).value("container", ""), id) << d.out;
  EXPECT_FALSE(process::alive(init));
  EXPECT_EQ(crun_pid(id), 0) << "crun still has the container it dumped";

  const auto i = test::run_cli({"--json", "inspect", ckpt.string()});
  const json rec = json::parse(i.out, nullptr, false)["extra"]["process"]["container"];
  EXPECT_EQ(rec.value("runtime", ""), "crun") << i.out;
  EXPECT_EQ(rec.value("root", ""), crun_root_.string());
  EXPECT_EQ(rec["crun"].value("cgroup_manager", ""), "cgroupfs") << i.out;

  auto r = cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rj = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(rj.is_object()) << r.out;
  EXPECT_EQ(rj.value("container", ""), id);
  EXPECT_EQ(rj.value("staging_mode", ""), "stream") << r.out;
  const pid_t back = crun_pid(id);
  ASSERT_GT(back, 0) << "crun does not know the restored container";
  EXPECT_EQ(rj.value("pid", 0), back);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  // crun's CRIU wrote its init's pid where a failed restore would find it to end it.
  const auto dirs = test::container_restore_dirs(id);
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_EQ(read_file(dirs.front() / "restored.pid"), std::to_string(back));
  ASSERT_TRUE(crun_do(*crun, {"list"}).ok());
  const std::string list = read_file(dir_.path() / "crun.out");
  EXPECT_NE(list.find(id), std::string::npos) << list;
  EXPECT_NE(list.find("running"), std::string::npos) << list;

  const std::string replica = unique_id("crun-r");
  crun_started_.push_back(replica);
  r = cli({"--json", "restore", ckpt.string(), "--container", replica});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t twin = crun_pid(replica);
  ASSERT_GT(twin, 0);
  EXPECT_EQ(redis(twin, {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
}

// gpuckpt killed at each phase of a crun container's dump before the checkpoint is durable: the
// container runs again with its data, and crun still knows it. Killed while crun restores a
// copy, or just after: crun keeps no half-made container, and the restore runs again.
TEST_F(E2eCrun, ACrunContainerKilledAtAnyPhaseRunsAgainAndCrunKeepsNoHalfMadeCopy) {
  const auto crun = criu_crun();
  if (!crun) GTEST_SKIP() << no_crun_;
  const auto [id, init, digest] = crun_serving("crun-f", *crun);
  ASSERT_GT(init, 0);
  ASSERT_EQ(digest.size(), 40u) << digest;
  const fs::path ckpt = dir_.path() / "f.ckpt";
  const auto launcher = test::on_cgroup2({});
  for (const std::string point : {"criu_dump", "compress_write"}) {
    SCOPED_TRACE(point);
    EXPECT_FALSE(test::signalled_at({"dump", "--container", id, "-o", ckpt.string()}, point,
                                    SIGKILL, dir_.path(), launcher)
                     .exited);
    EXPECT_TRUE(test::runs_again(init)) << "the container was left frozen";
    EXPECT_EQ(crun_pid(id), init);
    EXPECT_TRUE(test::wait_until([&] { return redis(init, {"DEBUG", "DIGEST"}) == digest; }));
    EXPECT_TRUE(test::wait_until([&] { return !fs::exists(ckpt); }));
    EXPECT_TRUE(test::wait_unlocked(init)) << "the guard never finished its recovery";
  }
  ASSERT_EQ(cli({"dump", "--container", id, "-o", ckpt.string(), "--leave-running"}).exit_code, 0);
  const std::string copy = unique_id("crun-h");
  crun_started_.push_back(copy);
  // restore_pages: while crun's CRIU reads the images from gpuckpt, crun's directory of the
  // copy made, its status not yet.
  for (const std::string point : {"criu_restore", "restore_pages", "criu_restored"}) {
    SCOPED_TRACE(point);
    (void)test::signalled_at({"restore", ckpt.string(), "--container", copy}, point, SIGKILL,
                             dir_.path(), launcher);
    EXPECT_TRUE(test::wait_until([&] { return !fs::exists(crun_root_ / copy); }))
        << "crun keeps the half-made container";
    EXPECT_TRUE(test::wait_until([&] { return test::container_restore_dirs(copy).empty(); }));
  }
  const auto r = cli({"restore", ckpt.string(), "--container", copy});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(crun_pid(copy), {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(redis(init, {"DEBUG", "DIGEST"}), digest);
}

// Failover of a crun container over ssh to a spare that has no copy of its bundle (the spare's
// gpuckpt runs in a mount namespace of its own, where the bundle's directory is an empty tmpfs):
// with --with-rootfs the rootfs goes with the checkpoint, and crun on the spare lists the copy,
// serving with its data and the file it wrote into its rootfs; crun here forgets the original.
TEST_F(E2eCrun, ACrunContainerMigratesOverSshWithItsRootfsToASpareWithoutItsBundle) {
  const auto crun = criu_crun();
  if (!crun) GTEST_SKIP() << no_crun_;
  const auto [id, init, digest] = crun_serving("crun-m", *crun);
  ASSERT_GT(init, 0);
  ASSERT_EQ(digest.size(), 40u) << digest;
  ASSERT_TRUE(crun_do(*crun, {"exec", id, "/usr/bin/sh", "-c", "echo inside > /etc/written"}).ok())
      << read_file(dir_.path() / "crun.err");
  test::close_inherited_fds();
  const test::NetNs host("crunspare");
  const test::SshHost ssh(host, dir_.path() / "ssh", "spare", "",
                          {"GPUCKPT_RUNC_ROOTS=" + crun_root_.string()});
  const fs::path spare = dir_.path() / "spare-gpuckpt";
  std::ofstream(spare)
      << "#!/bin/sh\nexec unshare --mount --propagation private /bin/sh -c "
         "'mount -t tmpfs spare \"$0\" && { [ \"$(stat -f -c %T /sys/fs/cgroup)\" "
         "= cgroup2fs ] || mount -t cgroup2 none /sys/fs/cgroup; } && exec \"$@\"' "
      << shell_quote(bundle_.string()) << " " << shell_quote(test::gpuckpt_binary().string())
      << " \"$@\"\n";
  fs::permissions(spare, fs::perms::owner_all);
  const std::string copy = unique_id("crun-m2");
  crun_started_.push_back(copy);
  const auto m = cli({"--json", "migrate", "--container", id, "--new-id", copy, "--to", ssh.url(),
                      "--ssh-config", ssh.config().string(), "--remote-gpuckpt", spare.string(),
                      "--spool", dir_.path().string(), "--probe",
                      "tcp:127.0.0.1:" + std::to_string(kRedisPort), "--with-rootfs"});
  ASSERT_EQ(m.exit_code, 0) << m.err << m.out;
  const json j = json::parse(m.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << m.out;
  EXPECT_EQ(j["target_result"].value("container", ""), copy) << m.out;
  const pid_t there = crun_pid(copy);
  ASSERT_GT(there, 0) << "crun on the spare does not list the copy";
  EXPECT_EQ(redis(there, {"DEBUG", "DIGEST"}), digest);
  ASSERT_TRUE(crun_do(*crun, {"exec", copy, "/usr/bin/cat", "/etc/written"}).ok())
      << read_file(dir_.path() / "crun.err");
  EXPECT_EQ(read_file(dir_.path() / "crun.out"), "inside\n");
  // Its root is the rootfs unpacked on the spare, not the bundle here.
  struct stat theirs {
  }, ours{};
  ASSERT_EQ(::stat(("/proc/" + std::to_string(there) + "/root").c_str(), &theirs), 0);
  ASSERT_EQ(::stat((bundle_ / "rootfs").c_str(), &ours), 0);
  EXPECT_NE(theirs.st_dev, ours.st_dev);
  EXPECT_FALSE(process::alive(init));
  EXPECT_EQ(crun_pid(id), 0) << "crun here still lists the original";
  EXPECT_FALSE(fs::exists(crun_root_ / id)) << "crun here keeps the original's directory";
}

// crun 1.8 enters the container's cgroup after its CRIU has restored the tree, and fails there
// for a spec whose resources it cannot apply (here a cgroup file no kernel has): crun exits
// with the tree running, lists nothing, and kills nothing. The restore ends that tree (its
// init's pid from CRIU's pidfile), and crun keeps no half-made container.
TEST_F(E2eCrun, ACrunThatFailsAfterItsCriuRestoredTheTreeLeavesNoTreeRunning) {
  const auto crun = criu_crun();
  if (!crun) GTEST_SKIP() << no_crun_;
  const auto [id, init, digest] = crun_serving("crun-u", *crun);
  ASSERT_GT(init, 0);
  // The bundle's spec, which the record takes, now asks for a cgroup file no kernel has.
  json spec = json::parse(read_file(bundle_ / "config.json"));
  spec["linux"]["resources"] = {{"unified", {{"gpuckpt.none", "1"}}}};
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const fs::path ckpt = dir_.path() / "u.ckpt";
  ASSERT_EQ(cli({"dump", "--container", id, "-o", ckpt.string(), "--leave-running"}).exit_code, 0);
  const std::string copy = unique_id("crun-u2");
  crun_started_.push_back(copy);
  const auto r = cli({"restore", ckpt.string(), "--container", copy});
  ASSERT_NE(r.exit_code, 0) << "crun restored a container whose cgroup file no kernel has";
  const std::string said = "crun restored container init ";
  const auto at = r.err.find(said);
  ASSERT_NE(at, std::string::npos) << r.err;
  const pid_t restored = std::atoi(r.err.c_str() + at + said.size());
  ASSERT_GT(restored, 0) << r.err;
  EXPECT_FALSE(process::alive(restored)) << "the tree that crun never listed runs on";
  EXPECT_FALSE(fs::exists(crun_root_ / copy)) << "crun keeps the half-made container";
  EXPECT_TRUE(test::container_restore_dirs(copy).empty());
  EXPECT_EQ(redis(init, {"DEBUG", "DIGEST"}), digest);
}

// A crun without CRIU (Debian 12's) could not bring a container back: the dump is refused
// naming it before anything is frozen, as is a restore.
TEST_F(E2eCrun, ACrunWithoutCriuIsRefusedBeforeAnythingIsFrozen) {
  const auto debians = find_executable("crun");
  if (!debians) GTEST_SKIP() << "crun is not installed (scripts/setup.sh installs it)";
  if (run_capture({debians->string(), "--version"}, 30s).output.find("+CRIU") != std::string::npos)
    GTEST_SKIP() << debians->string() << " has CRIU: no crun without it here";
  const std::string id = unique_id("nocriu");
  const pid_t init = run_crun(*debians, id, "disabled");
  ASSERT_GT(init, 0);
  ASSERT_TRUE(test::wait_until([&] { return redis(init, {"PING"}) == "PONG"; }));
  test::ScopedEnv only("GPUCKPT_CRUN", debians->string());
  const fs::path out = dir_.path() / "c.ckpt";
  const auto r = cli({"--json", "dump", "--container", id, "-o", out.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  const std::string msg = json::parse(r.out, nullptr, false)["error"].value("message", "");
  EXPECT_NE(msg.find(debians->string() + " was built without CRIU"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Nothing was frozen"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(test::process_state(init), 'S');
  EXPECT_EQ(redis(init, {"PING"}), "PONG");
}

// crun in a CRI pod: its container joins the pod's network namespace by its bind mount and the
// pod's ipc and uts namespaces by the sandbox's pid. crun's own restore joins what the spec
// names (its libcriu's inherit-fd for the network, join-ns for ipc and uts): back into the same
// pod, and with --join-ns into another, whose hostname it leaves as it is.
TEST_F(E2eCrun, ACrunContainerInACriPodComesBackIntoItAndMovesIntoAnother) {
  const auto crun = criu_crun();
  if (!crun) GTEST_SKIP() << no_crun_;
  const test::PodSandbox a("gk-cpod-a");
  const json spec = in_pod(a);  // read before the file is opened for writing, which empties it
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const auto [id, init, digest] = crun_serving("cpod", *crun);
  ASSERT_GT(init, 0);
  ASSERT_EQ(a.outside(init), "");
  const fs::path ckpt = dir_.path() / "cpod.ckpt";
  const auto d = cli({"dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_TRUE(test::wait_until([&] { return !process::alive(init); }));
  const auto r = cli({"restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t back = crun_pid(id);
  ASSERT_GT(back, 0);
  EXPECT_EQ(a.outside(back), "") << "restored outside the pod's namespaces";
  EXPECT_EQ(digest_in(a.net()), digest + "\n");

  const test::PodSandbox b("gk-cpod-b");
  const std::string rid = unique_id("cpod2");
  crun_started_.push_back(rid);
  const auto r2 =
      cli({"restore", ckpt.string(), "--container", rid, "--join-ns", "network=" + b.netns_path(),
           "--join-ns", "ipc=" + b.ns_path("ipc"), "--join-ns", "uts=" + b.ns_path("uts")});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  const pid_t copy = crun_pid(rid);
  ASSERT_GT(copy, 0);
  EXPECT_EQ(b.outside(copy), "") << "the copy is outside pod b's namespaces";
  EXPECT_EQ(b.hostname(), "gk-cpod-b\n") << "the restore renamed pod b";
  EXPECT_EQ(digest_in(b.net()), digest + "\n");
  EXPECT_EQ(a.outside(crun_pid(id)), "") << "the first pod's container moved";
}

// crun's state names no freezer: the init's own cgroup (cgroup.events, through the cgroup2
// mount that gpuckpt's mount table shows) says that crun paused it. Refused, and left paused.
TEST_F(E2eCrun, APausedCrunContainerIsRefusedAndLeftPaused) {
  const auto crun = criu_crun();
  if (!crun) GTEST_SKIP() << no_crun_;
  const auto [id, init, digest] = crun_serving("cpaused", *crun);
  ASSERT_GT(init, 0);
  ASSERT_TRUE(crun_do(*crun, {"pause", id}).ok()) << read_file(dir_.path() / "crun.err");
  const fs::path out = dir_.path() / "p.ckpt";
  const auto r = cli({"--json", "dump", "--container", id, "-o", out.string()});
  EXPECT_EQ(r.exit_code, 10) << r.out << r.err;
  EXPECT_NE(json::parse(r.out, nullptr, false)["error"].value("message", "").find("is paused"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(out));
  ASSERT_TRUE(crun_do(*crun, {"state", id}).ok());
  EXPECT_EQ(json::parse(read_file(dir_.path() / "crun.out"), nullptr, false).value("status", ""),
            "paused");
  ASSERT_TRUE(crun_do(*crun, {"resume", id}).ok()) << read_file(dir_.path() / "crun.err");
  EXPECT_EQ(redis(init, {"DEBUG", "DIGEST"}), digest);
}

// `unshare --pid --fork --mount-proc`: a pid namespace that no runtime's state names.
TEST_F(E2eContainer, AProcessInAPidNamespaceNoRuntimeMadeIsNamedAsSuch) {
  SpawnOptions o;
  o.new_session = true;
  o.stdout_file = dir_.path() / "u.out";
  o.stderr_file = dir_.path() / "u.err";
  Child u = spawn({"unshare", "--pid", "--fork", "--mount-proc", "/usr/bin/sleep", "1000"}, o);
  pid_t sleeper = 0;
  ASSERT_TRUE(test::wait_until([&] {
    for (pid_t q : process::live_pids_where(
             [&](const process::ProcInfo& p) { return p.ppid == u.pid() && p.comm == "sleep"; }))
      sleeper = q;
    return sleeper > 0;
  })) << read_file(dir_.path() / "u.err");
  const auto r = test::run_cli({"--json", "dump", "--pid", std::to_string(sleeper), "-o",
                                (dir_.path() / "u.ckpt").string()});
  EXPECT_EQ(r.exit_code, 10) << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  const std::string msg = j["error"].value("message", "");
  EXPECT_NE(msg.find("whose init is pid " + std::to_string(sleeper) + " (sleep)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("made by no container runtime gpuckpt knows"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("--new-pidns"), std::string::npos) << msg;
  EXPECT_EQ(test::process_state(sleeper), 'S');
  u.kill(SIGKILL);
  ::kill(sleeper, SIGKILL);
  u.wait();
}

// The spike, done by gpuckpt: redis in a runc container dumped whole, restored as a
// container runc lists under the same ID, with its data; and the restored one is a container
// that can be dumped again.
TEST_F(E2eContainer, AContainerComesBackAsARuncContainerWithItsData) {
  const auto [id, init, digest] = serving("whole");
  ASSERT_GT(init, 0);
  ASSERT_EQ(digest.size(), 40u) << digest;
  const fs::path ckpt = dir_.path() / "c.ckpt";
  auto d = test::run_cli({"--json", "dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const json dj = json::parse(d.out, nullptr, false);
  ASSERT_TRUE(dj.is_object()) << d.out;
  EXPECT_EQ(dj.value("container", ""), id);
  EXPECT_EQ(dj.value("pid", 0), init);
  const auto& stages = dj["timeline"]["stages"];
  EXPECT_TRUE(std::any_of(stages.begin(), stages.end(),
                          [](const json& s) { return s.value("name", "") == "runtime_delete"; }));
  // Ended, and runc has forgotten it: its ID is free.
  EXPECT_FALSE(process::alive(init));
  EXPECT_FALSE(runc({"state", id}).status.ok());

  // The record names the container, its bundle and its mounts.
  const auto i = test::run_cli({"--json", "inspect", ckpt.string()});
  const json ij = json::parse(i.out, nullptr, false);
  ASSERT_TRUE(ij.is_object()) << i.out;
  const json& rec = ij["extra"]["process"]["container"];
  EXPECT_EQ(rec.value("id", ""), id);
  EXPECT_EQ(rec.value("bundle", ""), bundle_.string());
  EXPECT_EQ(rec["spec"]["process"]["args"][0], "/usr/bin/redis-server");
  EXPECT_TRUE(std::any_of(rec["mounts"].begin(), rec["mounts"].end(),
                          [](const json& m) { return m.value("destination", "") == "/usr"; }));

  auto r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rj = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(rj.is_object()) << r.out;
  EXPECT_EQ(rj.value("container", ""), id);
  // runc's CRIU read the images from gpuckpt's streamer, not from files unpacked for it.
  EXPECT_EQ(rj.value("staging_mode", ""), "stream") << r.out;
  const auto& rstages = rj["timeline"]["stages"];
  EXPECT_TRUE(std::any_of(rstages.begin(), rstages.end(), [](const json& s) {
    return s.value("name", "") == "read_decompress" && s.value("bytes", 0) > 0;
  })) << r.out;
  const pid_t back = pid_of(id);
  ASSERT_GT(back, 0) << "runc does not list the restored container as running";
  EXPECT_EQ(rj.value("pid", 0), back);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);

  // Dumped again from where the restore put it, and back under another ID, from images
  // unpacked on the disk this time.
  const fs::path again = dir_.path() / "again.ckpt";
  d = test::run_cli({"dump", "--container", id, "-o", again.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const std::string id2 = unique_id("again");
  started_.push_back(id2);
  r = test::run_cli(
      {"--json", "restore", again.string(), "--container", id2, "--staging-mode", "staged"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out, nullptr, false).value("staging_mode", ""), "staged") << r.out;
  EXPECT_EQ(redis(pid_of(id2), {"DEBUG", "DIGEST"}), digest);
}

// A plain runc container's files are its bundle's rootfs, a host directory: a spare host
// without the bundle cannot restore it, nor one whose copy lacks what the container wrote there.
// `--with-rootfs` carries the directory in the checkpoint (streamed into it, or staged), and
// the restore unpacks it where the record says, whole or not at all; one that is there is used.
TEST_F(E2eContainer, ARuncBundlesRootfsTravelsWithItsCheckpointToAHostWithoutIt) {
  const auto [id, init, digest] = serving("rootfs");
  ASSERT_GT(init, 0);
  ASSERT_TRUE(runc({"exec", id, "/usr/bin/sh", "-c", "echo inside > /etc/written"}).status.ok())
      << read_file(dir_.path() / "runc.err");
  const fs::path rootfs = bundle_ / "rootfs";
  const fs::path plain = dir_.path() / "plain.ckpt", snap = dir_.path() / "snap.ckpt",
                 with = dir_.path() / "with.ckpt";
  ASSERT_EQ(
      test::run_cli({"dump", "--container", id, "-o", plain.string(), "--leave-running"}).exit_code,
      0);
  auto d = test::run_cli({"dump", "--container", id, "-o", snap.string(), "--leave-running",
                          "--with-rootfs", "--staging-mode", "staged"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  d = test::run_cli({"--json", "dump", "--container", id, "-o", with.string(), "--with-rootfs"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const json dj = json::parse(d.out, nullptr, false);
  ASSERT_TRUE(dj.is_object()) << d.out;
  EXPECT_EQ(dj.value("staging_mode", ""), "stream");
  const auto& stages = dj["timeline"]["stages"];
  EXPECT_TRUE(std::any_of(stages.begin(), stages.end(), [](const json& s) {
    return s.value("name", "") == "rootfs_diff" && s.value("bytes", 0) > 0;
  })) << d.out;
  for (const auto& c : {snap, with}) {
    const auto i = test::run_cli({"--json", "inspect", c.string()});
    const json ij = json::parse(i.out, nullptr, false);
    ASSERT_TRUE(ij.is_object()) << i.out;
    EXPECT_EQ(ij["extra"]["process"]["container"].value("writable_layer", ""), "rootfs");
    EXPECT_TRUE(std::any_of(ij["files"].begin(), ij["files"].end(), [](const json& f) {
      return f.value("path", "") == "rootfs.tar";
    })) << i.out;
  }
  EXPECT_NE(test::run_cli({"inspect", with.string()}).out.find("its whole rootfs (rootfs.tar)"),
            std::string::npos);
  EXPECT_FALSE(process::alive(init));

  // On this host, back in place on the very directory dumped: nothing to unpack.
  struct stat was {};
  ASSERT_EQ(::stat(rootfs.c_str(), &was), 0);
  auto r = test::run_cli({"--json", "restore", with.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("\"rootfs_apply\""), std::string::npos) << r.out;
  EXPECT_EQ(redis(pid_of(id), {"DEBUG", "DIGEST"}), digest);
  runc({"kill", id, "KILL"});
  ASSERT_TRUE(test::wait_until([&] { return pid_of(id) == 0; }));
  runc({"delete", "--force", id});

  // The other host: no bundle there.
  fs::rename(rootfs, bundle_ / "rootfs.away");
  r = test::run_cli({"--json", "restore", plain.string(), "--container"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find(rootfs.string() + ", the container's root filesystem, is not here"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--with-rootfs"), std::string::npos) << r.out;
  EXPECT_FALSE(runc({"state", id}).status.ok());

  // Killed with the rootfs unpacked beside its place, or once in place with the container
  // restored on it but not answering yet, or interrupted while it holds the rootfs in place
  // before runc starts: nothing half-made stays, there or in runc.
  auto leftovers = [&] {
    std::string found;
    for (const auto& e : fs::directory_iterator(bundle_))
      if (e.path().filename().string().rfind(".rootfs.", 0) == 0) found += e.path().filename();
    return found;
  };
  for (const auto& [point, sig] : {std::pair{"rootfs_unpacked", SIGKILL},
                                   {"criu_restored", SIGKILL},
                                   {"runtime_starting", SIGINT}}) {
    SCOPED_TRACE(point);
    (void)test::signalled_at({"restore", with.string(), "--container"}, point, sig, dir_.path());
    EXPECT_TRUE(test::wait_until([&] { return leftovers().empty() && !fs::exists(rootfs); }))
        << "what was unpacked stayed: " << leftovers();
    EXPECT_TRUE(test::wait_until([&] { return !runc({"state", id}).status.ok(); }));
  }

  r = test::run_cli({"--json", "restore", with.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rj = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(rj.is_object()) << r.out;
  const auto& rstages = rj["timeline"]["stages"];
  EXPECT_TRUE(std::any_of(rstages.begin(), rstages.end(), [](const json& s) {
    return s.value("name", "") == "rootfs_apply" && s.value("bytes", 0) > 0;
  })) << r.out;
  const pid_t back = pid_of(id);
  ASSERT_GT(back, 0) << "runc does not list the restored container as running";
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(runc({"exec", id, "/usr/bin/cat", "/etc/written"}).output, "inside\n");
  struct stat now {};
  ASSERT_EQ(::stat(rootfs.c_str(), &now), 0);
  EXPECT_NE(now.st_ino, was.st_ino);
  EXPECT_EQ(now.st_mode, was.st_mode);
  EXPECT_TRUE(fs::is_symlink(rootfs / "bin"));
  EXPECT_FALSE(fs::exists(rootfs / ".gpuckpt-temp"));
  EXPECT_EQ(leftovers(), "");

  // A replica of the same checkpoint runs on the rootfs unpacked for the first. Another
  // checkpoint's (the snapshot's) is refused on it, its files being another time's.
  const std::string replica = unique_id("rootfs2");
  started_.push_back(replica);
  r = test::run_cli({"restore", with.string(), "--container", replica});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(pid_of(replica), {"DEBUG", "DIGEST"}), digest);
  ASSERT_EQ(::stat(rootfs.c_str(), &was), 0);
  EXPECT_EQ(was.st_ino, now.st_ino);
  const std::string third = unique_id("rootfs3");
  started_.push_back(third);
  r = test::run_cli({"--json", "restore", snap.string(), "--container", third});
  EXPECT_EQ(r.exit_code, 12) << r.out << r.err;  // kExists
  EXPECT_NE(r.out.find("is neither the container's rootfs that was dumped nor one unpacked from "
                       "this checkpoint"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(runc({"state", third}).status.ok());

  // Moved away, the snapshot's own comes back from files unpacked on the disk.
  for (const auto& c : {id, replica}) {
    runc({"kill", c, "KILL"});
    ASSERT_TRUE(test::wait_until([&] { return pid_of(c) == 0; }));
    runc({"delete", "--force", c});
  }
  fs::rename(rootfs, bundle_ / "rootfs.first");
  r = test::run_cli({"restore", snap.string(), "--container", third, "--staging-mode", "staged"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(pid_of(third), {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(runc({"exec", third, "/usr/bin/cat", "/etc/written"}).output, "inside\n");

  // For a bare process there is no rootfs to carry.
  const auto bare = test::run_cli({"dump", "--pid", std::to_string(::getpid()), "-o",
                                   (dir_.path() / "bare.ckpt").string(), "--with-rootfs"});
  EXPECT_EQ(bare.exit_code, 2) << bare.err;
  EXPECT_NE(bare.err.find("for --container only"), std::string::npos) << bare.err;
}

// runc's CRIU reads the images as gpuckpt's streamer checks them: a chunk found damaged late in
// the pages is never given to CRIU, whose restore fails on a short image. runc removes what it
// made, and the error blames the checkpoint, not CRIU.
TEST_F(E2eContainer, AChunkFoundDamagedWhileRuncsCriuReadsItLeavesNoContainer) {
  const auto [id, init, digest] = serving("damaged");
  ASSERT_GT(init, 0);
  const fs::path ckpt = dir_.path() / "c.ckpt";
  auto d = test::run_cli({"dump", "--container", id, "-o", ckpt.string(), "--compress", "always"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  ASSERT_TRUE(test::damage_last_pages_chunk(ckpt)) << "no pages in the checkpoint";

  const auto r = test::run_cli({"restore", ckpt.string(), "--container"});
  EXPECT_EQ(r.exit_code, 4) << r.err;  // kCorrupt
  EXPECT_NE(r.err.find("no container was left"), std::string::npos) << r.err;
  EXPECT_EQ(pid_of(id), 0);
  EXPECT_FALSE(runc({"state", id}).status.ok()) << "runc still knows a half-restored container";
  EXPECT_TRUE(test::container_restore_dirs(id).empty());
}

// A warm snapshot scaled out: one checkpoint, two containers beside each other, each in a
// network namespace of its own, both serving the same port with the same data.
TEST_F(E2eContainer, OneCheckpointRestoredTwiceServesTwoReplicasOnTheSamePort) {
  const auto [id, init, digest] = serving("snap");
  ASSERT_GT(init, 0);
  const fs::path ckpt = snapshot(id, "snap.ckpt");
  ASSERT_FALSE(ckpt.empty());
  EXPECT_EQ(pid_of(id), init) << "a snapshot leaves its container running";
  std::vector<pid_t> replicas;
  for (const char* tag : {"r1", "r2"}) {
    const std::string rid = unique_id(tag);
    started_.push_back(rid);
    const auto r = test::run_cli({"restore", ckpt.string(), "--container", rid});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    replicas.push_back(pid_of(rid));
    ASSERT_GT(replicas.back(), 0);
    EXPECT_EQ(redis(replicas.back(), {"DEBUG", "DIGEST"}), digest);
  }
  EXPECT_NE(process::pid_namespace_inode(replicas[0]), process::pid_namespace_inode(replicas[1]));
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat(("/proc/" + std::to_string(replicas[0]) + "/ns/net").c_str(), &a), 0);
  ASSERT_EQ(::stat(("/proc/" + std::to_string(replicas[1]) + "/ns/net").c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
  // Each is its own: a write to one is not in the other, which answers.
  EXPECT_EQ(redis(replicas[0], {"SET", "only", "r1"}), "OK");
  EXPECT_EQ(redis(replicas[1], {"PING"}), "PONG");
  EXPECT_EQ(redis(replicas[1], {"EXISTS", "only"}), "0");
  EXPECT_EQ(redis(replicas[0], {"EXISTS", "only"}), "1");
}

// A Kubernetes pod's shape: the container joins a network namespace it does not own (the pod's,
// held by path as the runtime holds it for the pause container). The dump takes it as external,
// and the restore puts the container back into that very namespace, where a neighbour in the pod
// reaches it over the loopback they share. --netns puts a copy into another pod: a replica, or
// a migration's copy.
TEST_F(E2eContainer, AContainerInAPodsNetworkNamespaceComesBackIntoThatNamespace) {
  const test::NetNs pod("pod");
  const fs::path path = fs::path("/run/netns") / pod.name();
  json spec = json::parse(read_file(bundle_ / "config.json"));
  for (auto& ns : spec["linux"]["namespaces"])
    if (ns.value("type", "") == "network") ns["path"] = path.string();
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  auto netns_of = [](pid_t p) {
    return test::namespace_inode("/proc/" + std::to_string(p) + "/ns/net");
  };
  // A pod's namespace's inode.
  auto inode_of = [](const test::NetNs& ns) {
    return test::namespace_inode("/run/netns/" + ns.name());
  };
  const auto want = inode_of(pod);
  ASSERT_NE(want, 0u);
  const auto [id, init, digest] = serving("pod");
  ASSERT_GT(init, 0);
  ASSERT_EQ(netns_of(init), want);
  ASSERT_EQ(digest_in(pod), digest + "\n");

  const fs::path ckpt = dir_.path() / "pod.ckpt";
  const auto d = test::run_cli({"dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_TRUE(test::wait_until([&] { return !process::alive(init); }));
  const auto r = test::run_cli({"restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t back = pid_of(id);
  ASSERT_GT(back, 0);
  EXPECT_EQ(netns_of(back), want) << "restored outside the pod's network namespace";
  EXPECT_EQ(digest_in(pod), digest + "\n");

  // Scaled out into a second pod (--netns), beside the first; a namespace that is not here, or
  // that is no namespace, is refused before anything starts.
  const std::string rid = unique_id("pod2");
  started_.push_back(rid);
  for (const std::string& bad : std::vector<std::string>{
           "/run/netns/gpuckpt-no-such-pod", dir_.path().string(), "/proc/self/ns/ipc"}) {
    SCOPED_TRACE(bad);
    const auto e =
        test::run_cli({"--json", "restore", ckpt.string(), "--container", rid, "--netns", bad});
    EXPECT_EQ(e.exit_code, 3) << e.out;
    EXPECT_NE(e.out.find(bad), std::string::npos) << e.out;
    EXPECT_EQ(pid_of(rid), 0);
  }
  const test::NetNs second("pod2");
  const auto r2 = test::run_cli(
      {"restore", ckpt.string(), "--container", rid, "--netns", "/run/netns/" + second.name()});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  const pid_t replica = pid_of(rid);
  ASSERT_GT(replica, 0);
  const auto other = inode_of(second);
  ASSERT_NE(other, 0u);
  EXPECT_EQ(netns_of(replica), other);
  EXPECT_EQ(digest_in(second), digest + "\n");
  EXPECT_EQ(netns_of(pid_of(id)), want) << "the first pod's container moved";

  // Moved from the second pod into a third (a pod rescheduled): the copy joins the third, and
  // the original ends once the copy answers there.
  const test::NetNs third("pod3");
  const std::string mid = unique_id("pod3");
  started_.push_back(mid);
  const auto m =
      test::run_cli({"migrate", "--container", rid, "--new-id", mid, "--netns",
                     "/run/netns/" + third.name(), "--to", (dir_.path() / "pod3").string(),
                     "--probe", "tcp:127.0.0.1:" + std::to_string(kRedisPort)});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  ASSERT_NE(inode_of(third), 0u);
  ASSERT_GT(pid_of(mid), 0);
  EXPECT_EQ(netns_of(pid_of(mid)), inode_of(third));
  EXPECT_EQ(digest_in(third), digest + "\n");
  EXPECT_FALSE(process::alive(replica));

  // And back into the second pod under its own ID: the release frees the ID for the copy.
  const pid_t in_third = pid_of(mid);
  const auto back2 =
      test::run_cli({"migrate", "--container", mid, "--netns", "/run/netns/" + second.name(),
                     "--to", (dir_.path() / "pod2-back").string(), "--probe",
                     "tcp:127.0.0.1:" + std::to_string(kRedisPort)});
  ASSERT_EQ(back2.exit_code, 0) << back2.err;
  ASSERT_GT(pid_of(mid), 0);
  EXPECT_EQ(netns_of(pid_of(mid)), other);
  EXPECT_FALSE(process::alive(in_third));
}

// A pod's container: it joins the pod's network namespace by its bind mount (as CNI names it,
// /run/netns/NAME), and the pod's ipc and uts namespaces by its sandbox's pid
// (/proc/PAUSE/ns/ipc, as containerd's CRI names them). The restore puts it back into all
// three; a copy into another pod must name all three of that pod's (--join-ns), and leaves that
// pod its hostname.
TEST_F(E2eContainer, ACriPodsContainerMovesIntoAnotherPodWithEachOfItsNamespaces) {
  auto hostname_of = [](pid_t p) {
    return run_capture({"nsenter", "-t", std::to_string(p), "-u", "hostname"}, 30s).output;
  };
  const test::PodSandbox a("gk-pod-a");
  const json spec = in_pod(a);  // read before the file is opened for writing, which empties it
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  // What the pod keeps in its ipc namespace (a SysV segment another of its containers made),
  // which is the pod's: neither made again by a restore into that pod nor carried into another.
  a.make_sysv_segment();
  ASSERT_EQ(a.sysv_segments(), 1u);
  const auto [id, init, digest] = serving("cri");
  ASSERT_GT(init, 0);
  ASSERT_EQ(a.outside(init), "");
  ASSERT_EQ(hostname_of(init), "gk-pod-a\n");

  const fs::path ckpt = dir_.path() / "cri.ckpt";
  const auto d = test::run_cli({"dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_TRUE(test::wait_until([&] { return !process::alive(init); }));
  // What a restore into another pod must name, as inspect shows it.
  const auto shown = test::run_cli({"inspect", ckpt.string()});
  EXPECT_NE(shown.out.find("joins      ipc namespace " + a.ns_path("ipc")), std::string::npos)
      << shown.out;
  const auto r = test::run_cli({"restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t back = pid_of(id);
  ASSERT_GT(back, 0);
  EXPECT_EQ(a.outside(back), "") << "restored outside the pod's namespaces";
  EXPECT_EQ(digest_in(a.net()), digest + "\n");
  EXPECT_EQ(a.sysv_segments(), 1u);

  // Into a second pod: by its network alone it would be split across the two, so that is
  // refused before anything runs; with each of the second pod's namespaces it joins them all.
  const test::PodSandbox b("gk-pod-b");
  const std::string rid = unique_id("cri2");
  started_.push_back(rid);
  const auto split = test::run_cli(
      {"--json", "restore", ckpt.string(), "--container", rid, "--netns", b.netns_path()});
  EXPECT_EQ(split.exit_code, 2) << split.out;
  EXPECT_NE(split.out.find("--join-ns ipc=PATH"), std::string::npos) << split.out;
  EXPECT_EQ(pid_of(rid), 0);
  const auto r2 = test::run_cli(
      {"restore", ckpt.string(), "--container", rid, "--join-ns", "network=" + b.netns_path(),
       "--join-ns", "ipc=" + b.ns_path("ipc"), "--join-ns", "uts=" + b.ns_path("uts")});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  const pid_t copy = pid_of(rid);
  ASSERT_GT(copy, 0);
  EXPECT_EQ(b.outside(copy), "") << "the copy is outside pod b's namespaces";
  EXPECT_EQ(b.hostname(), "gk-pod-b\n") << "the restore renamed pod b";
  EXPECT_EQ(b.sysv_segments(), 0u) << "pod a's SysV segment was carried into pod b";
  EXPECT_EQ(digest_in(b.net()), digest + "\n");
  EXPECT_EQ(a.outside(pid_of(id)), "") << "the first pod's container moved";
  // Moved on from pod b into a third pod (a pod rescheduled), beside its frozen original: the
  // copy joins each of the third pod's namespaces, and the original ends once the copy answers.
  const test::PodSandbox c("gk-pod-c");
  const std::string mid = unique_id("cri3");
  started_.push_back(mid);
  const auto m = test::run_cli({"--json", "migrate", "--container", rid, "--new-id", mid,
                                "--join-ns", "network=" + c.netns_path(), "--join-ns",
                                "ipc=" + c.ns_path("ipc"), "--join-ns", "uts=" + c.ns_path("uts"),
                                "--to", (dir_.path() / "pod-c").string(), "--probe",
                                "tcp:127.0.0.1:" + std::to_string(kRedisPort)});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  EXPECT_EQ(json::parse(m.out, nullptr, false).value("handoff", ""), "frozen") << m.out;
  const pid_t moved = pid_of(mid);
  ASSERT_GT(moved, 0);
  EXPECT_EQ(c.outside(moved), "");
  EXPECT_EQ(c.hostname(), "gk-pod-c\n");
  EXPECT_EQ(digest_in(c.net()), digest + "\n");
  EXPECT_FALSE(process::alive(copy));
}

// A pod's container with a SysV segment of the pod's attached (one that another container of
// the pod made): CRIU would fail on it once everything is frozen, for the namespace it belongs
// to is the pod's, and not dumped with the container. Refused before the freeze.
TEST_F(E2eContainer, AContainerWithItsPodsSysvSegmentAttachedIsRefusedBeforeTheFreeze) {
  const test::PodSandbox pod("gk-pod-shm");
  const int segment = pod.make_sysv_segment();
  json spec = in_pod(pod);
  // Beside redis, a process of the container that attaches the segment and holds it.
  std::string redis_args;
  for (const auto& a : spec["process"]["args"]) redis_args += " '" + a.get<std::string>() + "'";
  spec["process"]["args"] = {"/bin/sh", "-c",
                             "/usr/bin/python3 -c 'import ctypes, time; c = ctypes.CDLL(None); "
                             "c.shmat.restype = ctypes.c_void_p; c.shmat(" +
                                 std::to_string(segment) + ", None, 0); time.sleep(86400)' & exec" +
                                 redis_args};
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const std::string id = unique_id("shm");
  const pid_t init = run_container(id);
  ASSERT_GT(init, 0);
  ASSERT_TRUE(test::wait_until([&] {
    for (const pid_t q : process::process_tree(init))
      if (process::maps_sysv_shm(q)) return true;
    return false;
  })) << "the container's process did not attach the pod's segment";

  const fs::path ckpt = dir_.path() / "shm.ckpt";
  const auto d = test::run_cli({"--json", "dump", "--container", id, "-o", ckpt.string()});
  EXPECT_EQ(d.exit_code, 2) << d.out;
  EXPECT_NE(d.out.find("SysV shared memory segment attached"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("Nothing was frozen"), std::string::npos) << d.out;
  EXPECT_EQ(pid_of(id), init);
  EXPECT_EQ(redis(init, {"PING"}), "PONG");
  EXPECT_FALSE(fs::exists(ckpt));
  EXPECT_EQ(pod.sysv_segments(), 1u);
}

// gpuckpt killed by any signal at each phase before the checkpoint is durable: the container
// runs again with its data, and runc still lists it as running.
TEST_F(E2eContainer, ASignalAtAnyPhaseOfAContainerDumpLeavesItRunningAndKnownToRunc) {
  const auto [id, init, digest] = serving("fault");
  ASSERT_GT(init, 0);
  const fs::path ckpt = dir_.path() / "f.ckpt";
  for (const std::string point : {"criu_dump", "compress_write"}) {
    for (const int sig : {SIGINT, SIGKILL}) {
      SCOPED_TRACE(point + " / " + strsignal(sig));
      EXPECT_FALSE(test::signalled_at({"dump", "--container", id, "-o", ckpt.string()}, point, sig,
                                      dir_.path())
                       .exited);
      EXPECT_TRUE(test::runs_again(init)) << "the container was left frozen";
      EXPECT_EQ(pid_of(id), init);
      EXPECT_TRUE(test::wait_until([&] { return redis(init, {"DEBUG", "DIGEST"}) == digest; }));
      EXPECT_TRUE(test::wait_until([&] { return !fs::exists(ckpt); }));
      EXPECT_TRUE(test::wait_unlocked(init)) << "the guard never finished its recovery";
    }
  }
  // Killed once the checkpoint is durable, before runc forgot the container: it ends as
  // planned, and its restore under the same ID deletes what runc still lists.
  (void)test::signalled_at({"dump", "--container", id, "-o", ckpt.string()}, "durable", SIGKILL,
                           dir_.path());
  EXPECT_TRUE(test::wait_until([&] { return !process::alive(init); }));
  const auto r = test::run_cli({"restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(pid_of(id), {"DEBUG", "DIGEST"}), digest);
}

// Each refusal comes before anything is frozen, names what is wrong, and loses nothing.
TEST_F(E2eContainer, WhatCannotBeDoneIsRefusedBeforeAnythingIsFrozen) {
  const fs::path ckpt = dir_.path() / "x.ckpt";
  auto expect_refused = [&](const std::vector<std::string>& args, int code,
                            const std::string& says) {
    auto full = args;
    full.insert(full.begin(), "--json");
    const auto r = test::run_cli(full);
    EXPECT_EQ(r.exit_code, code) << r.out << r.err;
    const json j = json::parse(r.out, nullptr, false);
    const std::string msg = j.is_object() ? j["error"].value("message", "") : r.out;
    EXPECT_NE(msg.find(says), std::string::npos) << msg;
  };
  expect_refused({"dump", "--container", "no-such-container", "-o", ckpt.string()}, 3,
                 "no running container no-such-container");
  expect_refused({"dump", "-o", ckpt.string()}, 2, "--pid PID or --container ID");

  // Paused by its runtime: left paused.
  const std::string paused = unique_id("paused");
  const pid_t p = run_container(paused);
  ASSERT_TRUE(runc({"pause", paused}).status.ok());
  expect_refused({"dump", "--container", paused, "-o", ckpt.string()}, 10, "is paused");
  const json state = json::parse(runc({"state", paused}).output, nullptr, false);
  EXPECT_EQ(state.value("status", ""), "paused");
  ASSERT_TRUE(runc({"resume", paused}).status.ok());

  // A `runc exec` still attached: its process is in the container, its parent runc is not.
  {
    SpawnOptions o;
    o.stdout_file = dir_.path() / "exec.out";
    o.stderr_file = dir_.path() / "exec.err";
    Child exec =
        spawn({runc_, "--root", root_.string(), "exec", paused, "/usr/bin/sleep", "997"}, o);
    pid_t inner = 0;
    ASSERT_TRUE(test::wait_until([&] {
      for (pid_t q : process::live_pids_where([&](const process::ProcInfo& i) {
             return i.comm == "sleep" &&
                    process::pid_namespace_inode(i.pid) == process::pid_namespace_inode(p);
           }))
        inner = q;
      return inner > 0;
    }));
    expect_refused({"dump", "--container", paused, "-o", ckpt.string()}, 10,
                   "but not under its init");
    EXPECT_EQ(test::process_state(inner), 'S');
    ::kill(inner, SIGKILL);
    exec.wait();
  }

  // Its output into a host file, which CRIU cannot dump: it keeps running. The same where a
  // bind mount shows that file inside (CRIU looks it up by the host mount it was opened
  // through): refused before the freeze, never a failed dump.
  const std::string files = unique_id("files");
  const pid_t f = run_container(files, /*files=*/true);
  expect_refused({"dump", "--container", files, "-o", ckpt.string()}, 10,
                 "a host file opened outside the container's mounts");
  EXPECT_EQ(pid_of(files), f);
  EXPECT_FALSE(fs::exists(ckpt));
  const std::string plain_spec = read_file(bundle_ / "config.json");
  json spec = json::parse(plain_spec);
  fs::create_directories(bundle_ / "rootfs" / dir_.path().relative_path());
  spec["mounts"].push_back({{"destination", dir_.path().string()},
                            {"type", "bind"},
                            {"source", dir_.path().string()},
                            {"options", {"rbind", "rw"}}});
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const std::string shown = unique_id("shown");
  const pid_t sh = run_container(shown, /*files=*/true);
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << plain_spec;
  ASSERT_TRUE(fs::exists(fs::path("/proc") / std::to_string(sh) / "root" /
                         dir_.path().relative_path() / "container.out"))
      << "the container does not see its output file";
  expect_refused({"dump", "--container", shown, "-o", ckpt.string()}, 10,
                 "a host file opened outside the container's mounts");
  EXPECT_EQ(pid_of(shown), sh);
  EXPECT_FALSE(fs::exists(ckpt));

  // A cgroup namespace joined by path, which runc's restore cannot join (its criu_linux.go).
  spec = json::parse(plain_spec);
  spec["linux"]["namespaces"].push_back(
      {{"type", "cgroup"}, {"path", "/proc/" + std::to_string(::getpid()) + "/ns/cgroup"}});
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const std::string cgroupns = unique_id("cgroupns");
  const pid_t cg = run_container(cgroupns);
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << plain_spec;
  ASSERT_GT(cg, 0);
  expect_refused({"dump", "--container", cgroupns, "-o", ckpt.string()}, 2,
                 "joined the cgroup namespace");
  EXPECT_EQ(pid_of(cgroupns), cg);
  EXPECT_FALSE(fs::exists(ckpt));

  // A checkpoint of it; a restore under an ID runc has, and one without --container.
  ASSERT_EQ(test::run_cli({"dump", "--container", paused, "-o", ckpt.string(), "--leave-running"})
                .exit_code,
            0);
  expect_refused({"restore", ckpt.string(), "--container", files}, 12,
                 "already has a container " + files);
  expect_refused({"restore", ckpt.string()}, 2, "restore it with --container");
  expect_refused({"restore", ckpt.string(), "--container", "../../etc"}, 2,
                 "no container ID runc accepts");
  EXPECT_EQ(pid_of(paused), p);
}

// A container moved on this host: to a copy under a new ID beside the frozen original (the
// frozen handoff), then back under its first ID, which the original's end frees (the release
// handoff). Each copy is a container runc lists, with the data, answering a probe made inside
// its own network namespace; the original is gone from runc's list.
TEST_F(E2eContainer, AContainerMigratedOnThisHostServesAsARuncContainerAndTheOriginalIsForgotten) {
  const auto [id, init, digest] = serving("move");
  ASSERT_GT(init, 0);
  const std::string copy = unique_id("moved");
  started_.push_back(copy);
  const std::string probe = "tcp:127.0.0.1:" + std::to_string(kRedisPort);
  auto m = test::run_cli({"--json", "migrate", "--container", id, "--new-id", copy, "--to",
                          (dir_.path() / "to").string(), "--probe", probe});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  json j = json::parse(m.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << m.out;
  EXPECT_EQ(j.value("handoff", ""), "frozen");
  EXPECT_EQ(j.value("container", ""), copy);
  const pid_t moved = pid_of(copy);
  ASSERT_GT(moved, 0) << "runc does not list the copy as running";
  EXPECT_EQ(j.value("pid", 0), moved);
  EXPECT_EQ(redis(moved, {"DEBUG", "DIGEST"}), digest);
  EXPECT_FALSE(process::alive(init));
  EXPECT_FALSE(runc({"state", id}).status.ok()) << "runc still lists the original";

  // Back under the copy's own ID: the original must end first, so the handoff is a release.
  m = test::run_cli({"--json", "migrate", "--container", copy, "--to",
                     (dir_.path() / "back").string(), "--probe", probe});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  j = json::parse(m.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << m.out;
  EXPECT_EQ(j.value("handoff", ""), "release");
  const pid_t back = pid_of(copy);
  ASSERT_GT(back, 0);
  EXPECT_NE(back, moved);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  EXPECT_FALSE(process::alive(moved));
  // A frozen handoff under the original's own ID is refused before anything is frozen.
  m = test::run_cli({"--json", "migrate", "--container", copy, "--handoff", "frozen", "--to",
                     (dir_.path() / "again").string()});
  EXPECT_EQ(m.exit_code, 2) << m.out << m.err;
  EXPECT_NE(m.out.find("--new-id"), std::string::npos) << m.out;
  EXPECT_EQ(pid_of(copy), back);
  EXPECT_EQ(redis(back, {"PING"}), "PONG");
}

// gpuckpt killed while runc restores a container, or just after: no half-made container stays
// in runc's list to hold the ID, and the restore runs again. In a migration the original runs
// again too, with its data, and runc still lists it.
TEST_F(E2eContainer, AContainerRestoreKilledAtAnyPointLeavesNoHalfMadeContainer) {
  const auto [id, init, digest] = serving("halfway");
  ASSERT_GT(init, 0);
  const fs::path ckpt = snapshot(id, "h.ckpt");
  ASSERT_FALSE(ckpt.empty());
  const std::string copy = unique_id("half");
  started_.push_back(copy);
  for (const std::string point : {"criu_restore", "criu_restored"}) {
    SCOPED_TRACE(point);
    (void)test::signalled_at({"restore", ckpt.string(), "--container", copy}, point, SIGKILL,
                             dir_.path());
    EXPECT_TRUE(test::wait_until([&] {
      return !runc({"state", copy}).status.ok();
    })) << "runc still lists the half-made container";
    EXPECT_TRUE(test::wait_until([&] { return test::container_restore_dirs(copy).empty(); }));
  }
  const auto r = test::run_cli({"restore", ckpt.string(), "--container", copy});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(pid_of(copy), {"DEBUG", "DIGEST"}), digest);
  runc({"kill", copy, "KILL"});
  ASSERT_TRUE(test::wait_until([&] { return pid_of(copy) == 0; }));
  runc({"delete", "--force", copy});

  // A migration killed once its copy runs, before that answered.
  Child g = test::paused_cli(
      {"migrate", "--container", id, "--new-id", copy, "--to", (dir_.path() / "to").string()},
      "criu_restored", dir_.path());
  g.kill(SIGKILL);
  g.wait();
  EXPECT_TRUE(test::runs_again(init)) << "the original was left frozen";
  EXPECT_EQ(pid_of(id), init);
  EXPECT_TRUE(test::wait_until([&] { return redis(init, {"DEBUG", "DIGEST"}) == digest; }));
  EXPECT_TRUE(test::wait_until([&] {
    return !runc({"state", copy}).status.ok();
  })) << "the migration's copy was left";
}

// A mount that a hook made and the spec does not name, as the NVIDIA container toolkit's hook
// binds the driver's files into the rootfs before the container starts: CRIU found no mount of
// the container showing it ("doesn't have a proper root mount") and failed once the container
// was frozen. It is dumped as an external mount from the host path it shows, recorded, checked
// on the target, and bound again at the restore, where runc runs the hook again (it finds the
// rootfs through the spec's root.path, as such hooks do).
TEST_F(E2eContainer, AMountAHookMadeOutsideTheSpecComesBackFromTheSameHostPath) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const fs::path models = dir_.path() / "host-models";
  fs::create_directories(models);
  std::ofstream(models / "weights.bin") << "weights\n";
  fs::create_directories(bundle_ / "rootfs" / "models");
  const fs::path hook = dir_.path() / "bind-models";
  std::ofstream(hook) << "#!/usr/bin/python3\n"
                         "import json, os, subprocess, sys\n"
                         "state = json.load(sys.stdin)\n"
                         "spec = json.load(open(os.path.join(state['bundle'], 'config.json')))\n"
                         "root = os.path.join(state['bundle'], spec['root']['path'])\n"
                         "subprocess.run(['/usr/bin/nsenter', '--mount=/proc/%d/ns/mnt' % "
                         "state['pid'], '/usr/bin/mount', '--bind', '-o', 'ro', "
                      << "'" << models.string() << "'"
                      << ", root + '/models'], check=True)\n";
  fs::permissions(hook, fs::perms::owner_all);
  json spec = json::parse(read_file(bundle_ / "config.json"));
  spec["hooks"]["createRuntime"] = {{{"path", hook.string()}}};
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const auto [id, init, digest] = serving("hook");
  ASSERT_GT(init, 0);
  const std::string in_container = "/proc/" + std::to_string(init) + "/root/models/weights.bin";
  ASSERT_EQ(read_file(in_container), "weights\n") << "the hook bound nothing";

  const fs::path ckpt = snapshot(id, "hook.ckpt");
  ASSERT_FALSE(ckpt.empty());
  const auto i = test::run_cli({"--json", "inspect", ckpt.string()});
  const json mounts = json::parse(i.out, nullptr, false)["extra"]["process"]["container"]["mounts"];
  const json expected = {
      {"destination", "/models"}, {"source", models.string()}, {"outside_spec", true}};
  EXPECT_NE(std::find(mounts.begin(), mounts.end(), expected), mounts.end()) << mounts.dump();

  // A target without that host path is refused before anything is started.
  const fs::path away = dir_.path() / "models-away";
  fs::rename(models, away);
  const std::string copy = unique_id("hook2");
  started_.push_back(copy);
  auto r = test::run_cli({"--json", "restore", ckpt.string(), "--container", copy});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find(models.string() + ", the source of one of the container's mounts"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(pid_of(copy), 0);
  fs::rename(away, models);

  r = test::run_cli({"restore", ckpt.string(), "--container", copy});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t back = pid_of(copy);
  ASSERT_GT(back, 0);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(read_file("/proc/" + std::to_string(back) + "/root/models/weights.bin"), "weights\n");
}

// A container with a cgroup namespace of its own: its cgroup file systems read, from the host's
// namespace, as its cgroup's path rather than "/", and no other mount of it shows them. They
// are CRIU's to mount again, not external mounts bound from the original's cgroup (which a dump
// deletes): a replica comes back with its own.
TEST_F(E2eContainer, AContainerInACgroupNamespaceOfItsOwnComesBackWithCgroupsOfItsOwn) {
  json spec = json::parse(read_file(bundle_ / "config.json"));
  spec["linux"]["namespaces"].push_back({{"type", "cgroup"}});
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const auto [id, init, digest] = serving("cgns");
  ASSERT_GT(init, 0);
  const fs::path ckpt = snapshot(id, "cgns.ckpt");
  ASSERT_FALSE(ckpt.empty());
  const auto i = test::run_cli({"--json", "inspect", ckpt.string()});
  const json mounts = json::parse(i.out, nullptr, false)["extra"]["process"]["container"]["mounts"];
  for (const auto& m : mounts) EXPECT_FALSE(m.value("outside_spec", false)) << m.dump();
  const std::string copy = unique_id("cgns2");
  started_.push_back(copy);
  const auto r = test::run_cli({"restore", ckpt.string(), "--container", copy});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t back = pid_of(copy);
  ASSERT_GT(back, 0);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  EXPECT_NE(read_file("/proc/" + std::to_string(back) + "/cgroup"),
            read_file("/proc/" + std::to_string(init) + "/cgroup"));
}

// A process of the container that uses io_uring, which CRIU 4.2 cannot dump: the container is
// refused before anything is frozen, and serves on.
TEST_F(E2eContainer, AContainerWithAProcessUsingIoUringIsRefusedBeforeTheFreeze) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  json spec = json::parse(read_file(bundle_ / "config.json"));
  // Beside redis, a process of the container holding an io_uring instance.
  std::string redis_args;
  for (const auto& a : spec["process"]["args"]) redis_args += " '" + a.get<std::string>() + "'";
  spec["process"]["args"] = {
      "/bin/sh", "-c",
      "/usr/bin/python3 -c 'import ctypes, time; ctypes.CDLL(None).syscall("
      "425, 4, ctypes.create_string_buffer(120)); time.sleep(86400)' & exec" +
          redis_args};
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const std::string id = unique_id("uring");
  const pid_t init = run_container(id);
  ASSERT_GT(init, 0);
  ASSERT_TRUE(test::wait_until([&] {
    for (const pid_t q : process::process_tree(init)) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(q) + "/fd", ec))
        if (fs::read_symlink(e.path(), ec).string() == "anon_inode:[io_uring]") return true;
    }
    return false;
  })) << "no process of the container set up an io_uring instance";
  const fs::path ckpt = dir_.path() / "u.ckpt";
  const auto d = test::run_cli({"dump", "--container", id, "-o", ckpt.string()});
  EXPECT_EQ(d.exit_code, 10) << d.err;
  EXPECT_NE(d.err.find("uses io_uring"), std::string::npos) << d.err;
  EXPECT_FALSE(fs::exists(ckpt));
  EXPECT_EQ(test::process_state(init), 'S');
  EXPECT_EQ(redis(init, {"PING"}), "PONG");
  EXPECT_EQ(pid_of(id), init);
}

// Two restores under one ID at once (a failover run twice): the second is refused before it
// does anything, and the first serves, whether or not the two checkpoints spell the runc root
// alike. Without the lock both passed their checks, and the loser's undo killed and deleted the
// winner's container.
TEST_F(E2eContainer, ASecondRestoreUnderTheSameIdIsRefusedAndTheFirstServes) {
  const auto [id, init, digest] = serving("twice");
  ASSERT_GT(init, 0);
  const fs::path ckpt = snapshot(id, "t.ckpt");
  ASSERT_FALSE(ckpt.empty());
  // A checkpoint that names the same runc root another way (a link to it, with a slash), as
  // $GPUCKPT_RUNC_ROOTS may: the same root to the lock.
  const fs::path link = dir_.path() / "runc-root-link";
  fs::create_directory_symlink(root_, link);
  fs::path spelled;
  {
    test::ScopedEnv roots("GPUCKPT_RUNC_ROOTS", link.string() + "/");
    spelled = snapshot(id, "t2.ckpt");
  }
  ASSERT_FALSE(spelled.empty());
  const json rec = json::parse(test::run_cli({"--json", "inspect", spelled.string()}).out, nullptr,
                               false)["extra"]["process"]["container"];
  ASSERT_EQ(rec.value("root", ""), link.string() + "/");
  const std::string copy = unique_id("once");
  started_.push_back(copy);
  Child first = test::paused_cli({"restore", ckpt.string(), "--container", copy},
                                 "runtime_starting", dir_.path(), test::Resume::kWhenUnmarked);
  for (const auto& c : {ckpt, spelled}) {
    const auto second = test::run_cli({"restore", c.string(), "--container", copy});
    EXPECT_EQ(second.exit_code, 12) << second.err;  // kExists
    EXPECT_NE(second.err.find("another gpuckpt is restoring a container " + copy),
              std::string::npos)
        << second.err;
  }
  test::resume_paused(dir_.path(), "runtime_starting");
  const auto st = first.wait_for(120s);
  ASSERT_TRUE(st && st->ok()) << read_file(dir_.path() / "cli.err");
  EXPECT_EQ(redis(pid_of(copy), {"DEBUG", "DIGEST"}), digest);
}

// A container that another made under the ID while a restore was under way (`runc run`, between
// the restore's check and its runc): the restore fails, and what it undoes is its own only.
TEST_F(E2eContainer, ARestoreThatLosesItsIdToAnotherContainerLeavesThatContainerRunning) {
  const auto [id, init, digest] = serving("loses");
  ASSERT_GT(init, 0);
  const fs::path ckpt = snapshot(id, "l.ckpt");
  ASSERT_FALSE(ckpt.empty());
  const std::string copy = unique_id("taken");
  Child restore = test::paused_cli({"restore", ckpt.string(), "--container", copy},
                                   "runtime_starting", dir_.path(), test::Resume::kWhenUnmarked);
  const pid_t other = run_container(copy);  // its own network namespace: the same port is free
  ASSERT_GT(other, 0);
  test::resume_paused(dir_.path(), "runtime_starting");
  const auto st = restore.wait_for(120s);
  ASSERT_TRUE(st);
  EXPECT_FALSE(st->ok()) << "runc restored a second container " << copy;
  EXPECT_EQ(pid_of(copy), other) << read_file(dir_.path() / "cli.err");
  EXPECT_EQ(redis(other, {"PING"}), "PONG");
  EXPECT_NE(redis(other, {"DEBUG", "DIGEST"}), digest) << "the other container is not the copy";
  EXPECT_TRUE(test::container_restore_dirs(copy).empty()) << "the failed restore left its bundle";
}

// Failover to a spare host: a container migrated over ssh (the other host is a network
// namespace with its own sshd, whose operator configured the same runc root) comes back there
// as a container runc lists, answering inside its own network namespace, and ends here. A
// checkpoint of it in object storage (a store on loopback) comes back as another container.
TEST_F(E2eContainer, AContainerMovesToAnotherHostOverSshAndComesBackFromObjectStorage) {
  const auto [id, init, digest] = serving("ssh");
  ASSERT_GT(init, 0);
  test::close_inherited_fds();
  const test::NetNs host("ctrhost");
  const test::SshHost ssh(host, dir_.path() / "ssh", "spare", "",
                          {"GPUCKPT_RUNC_ROOTS=" + root_.string()});
  const fs::path remote_spool = dir_.path() / "remote-spool";
  fs::create_directories(remote_spool);
  const std::string copy = unique_id("there");
  started_.push_back(copy);
  const auto m = test::run_cli(
      {"--json", "migrate", "--container", id, "--new-id", copy, "--to", ssh.url(), "--ssh-config",
       ssh.config().string(), "--remote-gpuckpt", test::gpuckpt_binary().string(), "--remote-spool",
       remote_spool.string(), "--spool", dir_.path().string(), "--probe",
       "tcp:127.0.0.1:" + std::to_string(kRedisPort)});
  ASSERT_EQ(m.exit_code, 0) << m.err << m.out;
  const json j = json::parse(m.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << m.out;
  EXPECT_EQ(j.value("target", ""), "ssh://spare");
  EXPECT_EQ(j["target_result"].value("container", ""), copy);
  const pid_t there = pid_of(copy);
  ASSERT_GT(there, 0) << "runc on the other host does not list the copy";
  EXPECT_EQ(j.value("pid", 0), there);
  EXPECT_EQ(redis(there, {"DEBUG", "DIGEST"}), digest);
  EXPECT_FALSE(process::alive(init));
  EXPECT_FALSE(runc({"state", id}).status.ok()) << "runc here still lists the original";

  // Its checkpoint in a store, restored under yet another ID.
  test::S3Server s3;
  s3.export_environment();
  const auto d = test::run_cli({"dump", "--container", copy, "-o", "s3://ckpts/ctr/a", "--spool",
                                dir_.path().string(), "--leave-running"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const std::string replica = unique_id("fromstore");
  started_.push_back(replica);
  const auto r = test::run_cli({"--json", "restore", "s3://ckpts/ctr/a", "--container", replica,
                                "--spool", remote_spool.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(pid_of(replica), {"DEBUG", "DIGEST"}), digest);
}

// Failover of a plain runc container to a spare that has no copy of its bundle: the spare's
// gpuckpt runs in a mount namespace of its own where the bundle's directory is an empty tmpfs.
// With --with-rootfs the target takes the migration (its check knows the rootfs comes with the
// checkpoint), unpacks the rootfs there, and the copy serves from it with what the container
// wrote into it; without, it is refused before the freeze.
TEST_F(E2eContainer, ARuncContainerMigratesWithItsRootfsToASpareWithoutItsBundle) {
  const auto [id, init, digest] = serving("spare");
  ASSERT_GT(init, 0);
  ASSERT_TRUE(runc({"exec", id, "/usr/bin/sh", "-c", "echo inside > /etc/written"}).status.ok())
      << read_file(dir_.path() / "runc.err");
  test::close_inherited_fds();
  const test::NetNs host("ctrspare");
  const test::SshHost ssh(host, dir_.path() / "ssh", "spare", "",
                          {"GPUCKPT_RUNC_ROOTS=" + root_.string()});
  const fs::path spare = dir_.path() / "spare-gpuckpt";
  // With BUNDLE.foreign here, the spare has a directory of its own at the rootfs's path.
  std::ofstream(spare) << "#!/bin/sh\nexec unshare --mount --propagation private /bin/sh -c "
                          "'mount -t tmpfs spare \"$0\" && { [ ! -e \"$0.foreign\" ] || "
                          "mkdir \"$0/rootfs\"; } && exec \"$@\"' "
                       << shell_quote(bundle_.string()) << " "
                       << shell_quote(test::gpuckpt_binary().string()) << " \"$@\"\n";
  fs::permissions(spare, fs::perms::owner_all);
  const std::string copy = unique_id("spare2");
  started_.push_back(copy);
  auto migrate = [&](bool with_rootfs) {
    std::vector<std::string> args{"--json",
                                  "migrate",
                                  "--container",
                                  id,
                                  "--new-id",
                                  copy,
                                  "--to",
                                  ssh.url(),
                                  "--ssh-config",
                                  ssh.config().string(),
                                  "--remote-gpuckpt",
                                  spare.string(),
                                  "--spool",
                                  dir_.path().string(),
                                  "--probe",
                                  "tcp:127.0.0.1:" + std::to_string(kRedisPort)};
    if (with_rootfs) args.push_back("--with-rootfs");
    return test::run_cli(args);
  };
  auto m = migrate(false);
  EXPECT_EQ(m.exit_code, 3) << m.out << m.err;
  EXPECT_NE(m.out.find("the container's root filesystem, is not here"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("nothing was frozen"), std::string::npos) << m.out;
  EXPECT_EQ(pid_of(id), init);
  // A spare with another directory there: refused before the freeze as well.
  std::ofstream(bundle_.string() + ".foreign").put('\n');
  m = migrate(true);
  EXPECT_EQ(m.exit_code, 12) << m.out << m.err;
  EXPECT_NE(m.out.find("is neither the container's rootfs that was dumped"), std::string::npos)
      << m.out;
  EXPECT_NE(m.out.find("nothing was frozen"), std::string::npos) << m.out;
  EXPECT_EQ(pid_of(id), init);
  EXPECT_EQ(test::process_state(init), 'S');
  fs::remove(bundle_.string() + ".foreign");

  m = migrate(true);
  ASSERT_EQ(m.exit_code, 0) << m.err << m.out;
  const pid_t there = pid_of(copy);
  ASSERT_GT(there, 0) << "runc on the spare does not list the copy";
  EXPECT_EQ(redis(there, {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(runc({"exec", copy, "/usr/bin/cat", "/etc/written"}).output, "inside\n");
  // Its root is the rootfs unpacked on the spare, not the bundle here.
  struct stat theirs {
  }, ours{};
  ASSERT_EQ(::stat(("/proc/" + std::to_string(there) + "/root").c_str(), &theirs), 0);
  ASSERT_EQ(::stat((bundle_ / "rootfs").c_str(), &ours), 0);
  EXPECT_NE(theirs.st_dev, ours.st_dev);
  EXPECT_FALSE(process::alive(init));
  EXPECT_FALSE(runc({"state", id}).status.ok()) << "runc here still lists the original";
}

// A target without a mount source of the container (its model directory, say) would fail the
// restore after the original was frozen, or ended. The target checks the rootfs and every
// mount source before it says it receives, so the migration is refused before the freeze,
// naming the path, over ssh as on this host; the container serves on, unfrozen.
TEST_F(E2eContainer, ATargetWithoutAMountSourceIsRefusedBeforeTheFreeze) {
  const fs::path models = dir_.path() / "models";
  fs::create_directories(models);
  fs::create_directories(bundle_ / "rootfs" / "models");
  json spec = json::parse(read_file(bundle_ / "config.json"));
  spec["mounts"].push_back({{"destination", "/models"},
                            {"type", "bind"},
                            {"source", models.string()},
                            {"options", {"rbind", "ro"}}});
  std::ofstream(bundle_ / "config.json", std::ios::trunc) << spec.dump(1);
  const auto [id, init, digest] = serving("mounts");
  ASSERT_GT(init, 0);
  // Gone from the host (the container keeps its bind mount): as on a target that lacks it.
  fs::remove_all(models);

  test::close_inherited_fds();
  const test::NetNs host("ctrmnt");
  const test::SshHost ssh(host, dir_.path() / "ssh", "spare", "",
                          {"GPUCKPT_RUNC_ROOTS=" + root_.string()});
  const std::string copy = unique_id("nomodels");
  started_.push_back(copy);
  auto m = test::run_cli({"--json", "migrate", "--container", id, "--new-id", copy, "--to",
                          ssh.url(), "--ssh-config", ssh.config().string(), "--remote-gpuckpt",
                          test::gpuckpt_binary().string(), "--spool", dir_.path().string()});
  EXPECT_EQ(m.exit_code, 3) << m.out << m.err;
  EXPECT_NE(m.out.find(models.string() + ", the source of one of the container's mounts"),
            std::string::npos)
      << m.out;
  EXPECT_NE(m.out.find("nothing was frozen"), std::string::npos) << m.out;
  // An ID that runs there: refused before the freeze too, with the target's code.
  m = test::run_cli({"--json", "migrate", "--container", id, "--new-id", id, "--to", ssh.url(),
                     "--ssh-config", ssh.config().string(), "--remote-gpuckpt",
                     test::gpuckpt_binary().string(), "--spool", dir_.path().string()});
  EXPECT_EQ(m.exit_code, 12) << m.out << m.err;
  EXPECT_NE(m.out.find("already has a container " + id + " running"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("nothing was frozen"), std::string::npos) << m.out;
  m = test::run_cli({"--json", "migrate", "--container", id, "--new-id", copy, "--to",
                     (dir_.path() / "to").string()});
  EXPECT_EQ(m.exit_code, 3) << m.out << m.err;
  EXPECT_NE(m.out.find(models.string()), std::string::npos) << m.out;
  // Never frozen: it serves, with its data, and runc lists it; no copy was made.
  EXPECT_EQ(pid_of(id), init);
  EXPECT_EQ(redis(init, {"DEBUG", "DIGEST"}), digest);
  EXPECT_FALSE(runc({"state", copy}).status.ok());
  EXPECT_FALSE(fs::exists(dir_.path() / "to"));
}

// `bench dump --container`: the demo server in a runc container, dumped and restored by gpuckpt
// and by runc's own checkpoint and restore with the same CRIU, side by side; runc is what the
// ratios compare with, and nothing of the benchmark's stays with runc or on the disk.
TEST_F(E2eContainer, BenchComparesAContainerDumpAndRestoreWithRuncsOwn) {
  const fs::path bench = dir_.path() / "bench";
  fs::create_directories(bench);
  const test::CliResult b =
      test::run_cli({"--json", "bench", "dump", "--container", "--dir", bench.string(), "--size",
                     "64M", "--runs", "1", "--memory", "warm"},
                    300);
  ASSERT_EQ(b.exit_code, 0) << b.err << b.out;
  const json j = json::parse(b.out);
  EXPECT_EQ(j.value("plain", ""), "runc");
  std::vector<std::string> names;
  for (const json& m : j.at("methods")) {
    names.push_back(m.at("name"));
    EXPECT_GT(m.at("dump_median_seconds").get<double>(), 0) << names.back();
    EXPECT_GT(m.at("restore_median_seconds").get<double>(), 0) << names.back();
    EXPECT_GT(m.at("checkpoint_bytes").get<std::uint64_t>(), 0u) << names.back();
    EXPECT_FALSE(m.contains("restore_time_vs_criu")) << "runc is the plain tool here";
  }
  EXPECT_EQ(names, (std::vector<std::string>{"container", "runc"}));
  EXPECT_EQ(j.at("methods").back().at("restore_time_vs_plain").get<double>(), 1.0);
  const auto left = runc_list_default_root();
  EXPECT_EQ(left.find("gpuckpt-bench-"), std::string::npos) << left;
  EXPECT_FALSE(fs::exists(bench / "bench-bundle"));
}

// gpuckpt and its guard both killed while a migration's copy runs but has not answered: the
// next `gpuckpt recover` finds the operation in its journal, kills that copy and deletes it
// from runc's state (it knows the copy's init), and resumes the frozen original, still listed
// by runc, with its data.
TEST_F(E2eContainer, RecoverAfterGpuckptAndItsGuardDieEndsTheCopyAndResumesTheOriginal) {
  // A journal of its own: any gpuckpt that another suite runs meanwhile would recover an
  // abandoned journal in the shared run directory before this test's `recover` does.
  const test::ScopedEnv env("GPUCKPT_RUN_DIR", (dir_.path() / "run").string());
  const auto [id, init, digest] = serving("orphan");
  ASSERT_GT(init, 0);
  const std::string copy = unique_id("orphancopy");
  started_.push_back(copy);
  Child g = test::paused_cli(
      {"migrate", "--container", id, "--new-id", copy, "--to", (dir_.path() / "to").string()},
      "criu_restored", dir_.path());
  const auto guards = process::live_pids_where(
      [&](const process::ProcInfo& p) { return p.ppid == g.pid() && p.comm == "gpuckpt-guard"; });
  ASSERT_EQ(guards.size(), 1u);
  ::kill(guards.front(), SIGKILL);
  ASSERT_TRUE(test::wait_until([&] {
    const auto p = process::read_proc(guards.front());
    return !p || p->state == 'Z';
  }));
  g.kill(SIGKILL);
  g.wait();
  ASSERT_GT(pid_of(copy), 0) << "the copy should run until the recovery";
  EXPECT_EQ(test::process_state(init), 'T') << "the original should be frozen until then";

  const auto r = test::run_cli({"--json", "recover"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("the restored container " + copy + " was killed and deleted from runc"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(runc({"state", copy}).status.ok()) << "runc still lists the copy";
  EXPECT_TRUE(test::runs_again(init)) << "the original was left frozen";
  EXPECT_EQ(pid_of(id), init);
  EXPECT_TRUE(test::wait_until([&] { return redis(init, {"DEBUG", "DIGEST"}) == digest; }));
}
