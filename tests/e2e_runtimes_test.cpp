// Containers that containerd and Docker run, with their real daemons (started by the test, on
// sockets, roots and namespaces of its own), real runc and CRIU, and a redis server in an image
// the test builds from local files (no registry reaches this machine): `dump --container` takes
// one whole, and `restore --container` brings it back as the container its runtime knows
// (`ctr task ls`, `docker ps`), in place or as a replica beside it, with its data (DEBUG
// DIGEST). A restore killed at any point leaves no half-made task, and what cannot be done is
// refused before anything is frozen or started.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "container/containerd.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr int kRedisPort = 6379;
const std::vector<std::string> kRedisArgs = {
    "/usr/bin/redis-server", "--port", std::to_string(kRedisPort), "--save", "",
    "--appendonly",          "no",     "--enable-debug-command",   "yes"};

// Whether a --json result's timeline has the stage `name`.
bool has_stage(const std::string& out, const std::string& name) {
  const json j = json::parse(out, nullptr, false);
  if (!j.is_object() || !j.contains("timeline")) return false;
  const json& stages = j["timeline"]["stages"];
  return std::any_of(stages.begin(), stages.end(),
                     [&](const json& s) { return s.value("name", "") == name; });
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

class E2eRuntimes : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* b : {"containerd", "ctr", "containerd-shim-runc-v2", "runc", "redis-server",
                          "redis-cli", "tar", "sha256sum"})
      if (!find_executable(b))
        GTEST_SKIP() << b << " is not installed (scripts/setup.sh installs it)";
    if (!fs::exists(fs::path(GPUCKPT_CRIU_PREFIX) / "bin" / "criu"))
      GTEST_SKIP() << "gpuckpt's CRIU is not installed (scripts/install-criu.sh)";
    ns_ = "gk-" + std::to_string(::getpid());
    make_layer();
    start_containerd();
  }

  void TearDown() override {
    if (docker_) {
      for (const auto& n : docker_names_) (void)docker({"rm", "-f", n});
      docker_->kill(SIGTERM);
      docker_->wait();
    }
    if (containerd_) {
      for (const auto& id : ctr_ids_) {
        (void)ctr({"task", "kill", "-s", "SIGKILL", id});
        (void)test::wait_until([&] { return task_pid(id) == 0; });
        (void)ctr({"task", "rm", "-f", id});
        (void)ctr({"container", "rm", id});
      }
      (void)ctr({"image", "rm", kImage});
      containerd_->kill(SIGTERM);
      containerd_->wait();
      // The shims' runc root for the test's namespace.
      std::error_code ec;
      fs::remove(fs::path("/run/containerd/runc") / ns_, ec);
    }
    for (const auto& id : ctr_ids_) {
      std::error_code ec;
      test::remove_container_restore_dirs(id);
      fs::remove(fs::path("/var/log/gpuckpt/containers") / (id + ".log"), ec);
    }
  }

  static constexpr const char* kImage = "localhost/gk-redis:1";

  // An image layer of empty mount points and a merged /usr's links; the host's /usr is bound in
  // read-only when a container runs, as in the runc tests.
  void make_layer() {
    const fs::path l = dir_.path() / "layer";
    for (const char* d : {"usr", "proc", "dev", "sys", "tmp", "etc"}) fs::create_directories(l / d);
    for (const char* s : {"bin", "lib", "lib64", "sbin"})
      fs::create_symlink(fs::path("usr") / s, l / s);
    std::ofstream(l / "etc" / "motd") << "from the image\n";
    layer_ = dir_.path() / "layer.tar";
    ASSERT_TRUE(
        run_capture({"tar", "-C", l.string(), "-cf", layer_.string(), "."}, 60s).status.ok());
  }

  // A blob of an OCI image layout, named by its digest.
  json blob(const fs::path& layout, const std::string& media, const std::string& content) {
    const fs::path tmp = layout / "blob.tmp";
    std::ofstream(tmp, std::ios::binary) << content;
    const std::string sum = run_capture({"sha256sum", tmp.string()}, 60s).output.substr(0, 64);
    fs::rename(tmp, layout / "blobs" / "sha256" / sum);
    return {{"mediaType", media}, {"digest", "sha256:" + sum}, {"size", content.size()}};
  }

  // The image, as an OCI archive that `ctr image import` takes.
  fs::path oci_archive() {
    const fs::path layout = dir_.path() / "oci";
    fs::create_directories(layout / "blobs" / "sha256");
    const json layer = blob(layout, "application/vnd.oci.image.layer.v1.tar", read_file(layer_));
    const json config = blob(layout, "application/vnd.oci.image.config.v1+json",
                             json{{"architecture", "amd64"},
                                  {"os", "linux"},
                                  {"rootfs", {{"type", "layers"}, {"diff_ids", {layer["digest"]}}}},
                                  {"config", {{"Cmd", kRedisArgs}}}}
                                 .dump());
    json manifest = blob(layout, "application/vnd.oci.image.manifest.v1+json",
                         json{{"schemaVersion", 2},
                              {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
                              {"config", config},
                              {"layers", {layer}}}
                             .dump());
    manifest["annotations"] = {{"org.opencontainers.image.ref.name", "1"}};
    std::ofstream(layout / "index.json") << json{{"schemaVersion", 2}, {"manifests", {manifest}}};
    std::ofstream(layout / "oci-layout") << R"({"imageLayoutVersion":"1.0.0"})";
    const fs::path tar = dir_.path() / "image.tar";
    EXPECT_TRUE(
        run_capture({"tar", "-C", layout.string(), "-cf", tar.string(), "."}, 60s).status.ok());
    return tar;
  }

  // containerd on a socket and root of the test's own; its shims find gpuckpt's CRIU first on
  // their PATH, as docs/OPERATORS.md has an operator set up. `cgroup2`: it and its shims see
  // cgroup v2 alone (test::on_cgroup2), as crun needs.
  void start_containerd(bool cgroup2 = false) {
    const fs::path w = dir_.path();
    sock_ = w / "containerd.sock";
    std::ofstream(w / "containerd.toml")
        << "version = 2\nroot = \"" << (w / "ctd-root").string() << "\"\nstate = \""
        << (w / "ctd-state").string() << "\"\n[grpc]\n  address = \"" << sock_.string()
        << "\"\n[plugins.\"io.containerd.internal.v1.opt\"]\n"
           "  path = \""
        << (w / "ctd-opt").string()
        << "\"\n[plugins.\"io.containerd.grpc.v1.cri\"]\n"
           "  disable_tcp_service = true\n";
    SpawnOptions o;
    // Where it unpacks a checkpoint that dockerd hands it, for the test to look.
    fs::create_directories(w / "ctd-tmp");
    o.env = {"PATH=" + (fs::path(GPUCKPT_CRIU_PREFIX) / "bin").string() + ":" + std::getenv("PATH"),
             "XDG_RUNTIME_DIR=", "TMPDIR=" + (w / "ctd-tmp").string()};
    o.stdout_file = o.stderr_file = w / "containerd.log";
    o.new_session = true;
    std::vector<std::string> argv{"containerd", "--config", (w / "containerd.toml").string()};
    containerd_ = spawn(cgroup2 ? test::on_cgroup2(argv) : argv, o);
    ASSERT_TRUE(test::wait_until([&] { return ctr({"version"}).status.ok(); }))
        << read_file(w / "containerd.log");
    address_.emplace("CONTAINERD_ADDRESS", sock_.string());
  }

  RunResult ctr(std::vector<std::string> args) {
    args.insert(args.begin(), {"ctr", "--address", sock_.string(), "-n", ns_});
    SpawnOptions o;
    o.stderr_file = dir_.path() / "ctr.err";
    try {
      return run_capture(args, 60s, o);
    } catch (const Error& e) {
      return RunResult{ExitStatus{true, 1}, e.what()};
    }
  }

  // containerd's task of container `id`: its init's host pid while it runs, else 0.
  pid_t task_pid(const std::string& id) {
    const RunResult r = ctr({"task", "ls"});
    std::istringstream in(r.output);
    for (std::string name, pid, status; in >> name >> pid >> status;)
      if (name == id && status == "RUNNING") return std::atoi(pid.c_str());
    return 0;
  }
  bool has_container(const std::string& id) { return ctr({"container", "info", id}).status.ok(); }

  // A containerd container of the test's image serving redis with some data.
  struct Serving {
    std::string id;
    pid_t init = 0;
    std::string digest;
  };
  // `with`: more options of `ctr run` (--with-ns TYPE:PATH, the namespaces of a pod).
  Serving ctr_serving(const std::string& tag, const std::string& snapshotter = "overlayfs",
                      const std::vector<std::string>& with = {}) {
    if (!imported_) {
      EXPECT_TRUE(
          ctr({"image", "import", "--base-name", "localhost/gk-redis", oci_archive().string()})
              .status.ok())
          << read_file(dir_.path() / "ctr.err");
      imported_ = true;
    }
    Serving s{tag + "-" + std::to_string(::getpid())};
    ctr_ids_.push_back(s.id);
    std::vector<std::string> run{"run",           "-d",
                                 "--snapshotter", snapshotter,
                                 "--mount",       "type=bind,src=/usr,dst=/usr,options=rbind:ro"};
    run.insert(run.end(), with.begin(), with.end());
    run.insert(run.end(), {kImage, s.id});
    const RunResult r = ctr(run);
    EXPECT_TRUE(r.status.ok()) << r.output << read_file(dir_.path() / "ctr.err");
    EXPECT_TRUE(test::wait_until([&] {
      s.init = task_pid(s.id);
      return s.init > 0 && redis(s.init, {"PING"}) == "PONG";
    }));
    if (s.init > 0) s.digest = fill(s.init);
    return s;
  }

  // Why Docker's tests cannot run here ("" when they can): Debian's docker.io, and the
  // tcp-close that a Docker restore's CRIU needs in /etc/criu/runc.conf (docs/OPERATORS.md says
  // why; scripts/setup.sh installs and writes both).
  static std::string docker_missing() {
    if (!find_executable("dockerd")) return "docker.io is not installed (scripts/setup.sh)";
    std::ifstream conf("/etc/criu/runc.conf");
    const std::string text((std::istreambuf_iterator<char>(conf)),
                           std::istreambuf_iterator<char>());
    if (text.find("tcp-close") == std::string::npos)
      return "/etc/criu/runc.conf lacks tcp-close (scripts/setup.sh writes it)";
    return {};
  }

  // dockerd on this test's containerd, with roots and a socket of its own, no bridge and no
  // iptables rules: its containers run with --network none (a network namespace of their own).
  void start_docker() {
    const fs::path w = dir_.path();
    docker_sock_ = w / "docker.sock";
    std::ofstream(w / "daemon.json") << "{}";
    SpawnOptions o;
    o.stdout_file = o.stderr_file = w / "dockerd.log";
    o.new_session = true;
    docker_ = spawn({"dockerd", "--config-file", (w / "daemon.json").string(), "--data-root",
                     (w / "docker").string(), "--exec-root", (w / "dexec").string(), "--pidfile",
                     (w / "dockerd.pid").string(), "-H", "unix://" + docker_sock_.string(),
                     "--containerd", sock_.string(), "--bridge", "none", "--iptables=false",
                     "--ip-masq=false", "--ip-forward=false", "--experimental"},
                    o);
    ASSERT_TRUE(test::wait_until([&] { return docker({"version"}).status.ok(); }))
        << read_file(w / "dockerd.log");
    docker_host_.emplace("DOCKER_HOST", "unix://" + docker_sock_.string());
    ASSERT_TRUE(docker({"import", "-c", "CMD " + json(kRedisArgs).dump(), layer_.string(),
                        "localhost/gk-redis:d"})
                    .status.ok())
        << read_file(dir_.path() / "docker.err");
  }

  RunResult docker(std::vector<std::string> args) {
    // Debian's client: a newer one earlier on PATH may not speak to Debian's daemon.
    const std::string bin = fs::exists("/usr/bin/docker") ? "/usr/bin/docker" : "docker";
    args.insert(args.begin(), {bin, "-H", "unix://" + docker_sock_.string()});
    SpawnOptions o;
    o.stderr_file = dir_.path() / "docker.err";
    try {
      return run_capture(args, 60s, o);
    } catch (const Error& e) {
      return RunResult{ExitStatus{true, 1}, e.what()};
    }
  }

  // Docker's view of container `name`: its init's pid while it runs, else 0.
  pid_t docker_pid(const std::string& name) {
    const RunResult r = docker({"inspect", "-f", "{{.State.Running}} {{.State.Pid}}", name});
    if (!r.status.ok() || r.output.rfind("true ", 0) != 0) return 0;
    return std::atoi(r.output.c_str() + 5);
  }

  // `with`: more options of `docker run`.
  Serving docker_serving(const std::string& tag, const std::vector<std::string>& with = {}) {
    Serving s{tag + "-" + std::to_string(::getpid())};
    docker_names_.push_back(s.id);
    std::vector<std::string> run{"run",       "-d",   "--name", s.id,
                                 "--network", "none", "-v",     "/usr:/usr:ro"};
    run.insert(run.end(), with.begin(), with.end());
    run.push_back("localhost/gk-redis:d");
    const RunResult r = docker(run);
    EXPECT_TRUE(r.status.ok()) << r.output << read_file(dir_.path() / "docker.err");
    EXPECT_TRUE(test::wait_until([&] {
      s.init = docker_pid(s.id);
      return s.init > 0 && redis(s.init, {"PING"}) == "PONG";
    }));
    if (s.init > 0) s.digest = fill(s.init);
    return s;
  }

  // redis-cli ARGS inside the network namespace of `pid`; its answer without the newline.
  static std::string redis(pid_t pid, std::vector<std::string> args) {
    args.insert(args.begin(), {"nsenter", "--net=/proc/" + std::to_string(pid) + "/ns/net",
                               "redis-cli", "-p", std::to_string(kRedisPort)});
    try {
      return trimmed(run_capture(args, 30s).output);
    } catch (const Error&) {
      return {};
    }
  }
  // What a container writes into its image's rootfs: a file added, one of the image's deleted.
  static void write_layer(pid_t init) {
    const fs::path root = "/proc/" + std::to_string(init) + "/root";
    std::ofstream(root / "etc" / "written") << "by the container\n";
    fs::remove(root / "etc" / "motd");
  }
  // Whether the container of `init` has that layer.
  static bool has_layer(pid_t init) {
    const fs::path root = "/proc/" + std::to_string(init) + "/root";
    std::error_code ec;
    return read_file(root / "etc" / "written") == "by the container\n" &&
           !fs::exists(root / "etc" / "motd", ec);
  }

  static std::string fill(pid_t pid) {
    for (int i = 0; i < 200; ++i)
      redis(pid,
            {"SET", "key:" + std::to_string(i), std::string(512, static_cast<char>('a' + i % 26))});
    return redis(pid, {"DEBUG", "DIGEST"});
  }

  TempDir dir_ = test::scratch_dir("gpuckpt-e2e-runtimes");
  std::string ns_;
  fs::path layer_, sock_, docker_sock_;
  bool imported_ = false;
  std::optional<Child> containerd_, docker_;
  std::optional<test::ScopedEnv> address_, docker_host_;
  std::vector<std::string> ctr_ids_, docker_names_;
};

}  // namespace

// The container keeps its record in containerd through the dump (only its task ends), and
// comes back as its task, with its data; the same checkpoint makes a replica beside it, a new
// container record over a fresh snapshot of the image, serving the same port in its own network
// namespace; a third restore under a name that runs is refused.
TEST_F(E2eRuntimes, AContainerdContainerComesBackAsItsTaskAndAsAReplica) {
  const auto [id, init, digest] = ctr_serving("ctd");
  ASSERT_GT(init, 0);
  ASSERT_EQ(digest.size(), 40u) << digest;
  write_layer(init);
  const fs::path ckpt = dir_.path() / "c.ckpt";
  auto d = test::run_cli({"--json", "dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_TRUE(has_stage(d.out, "rootfs_diff")) << d.out;
  EXPECT_TRUE(has_stage(d.out, "runtime_delete")) << d.out;
  EXPECT_FALSE(process::alive(init));
  EXPECT_EQ(task_pid(id), 0);
  EXPECT_TRUE(has_container(id)) << "containerd forgot the container itself";

  const auto i = test::run_cli({"--json", "inspect", ckpt.string()});
  const json rec = json::parse(i.out, nullptr, false)["extra"]["process"]["container"];
  EXPECT_EQ(rec.value("runtime", ""), "containerd");
  EXPECT_EQ(rec["containerd"].value("namespace", ""), ns_);
  EXPECT_EQ(rec["containerd"].value("image", ""), kImage);
  EXPECT_EQ(rec["containerd"].value("snapshotter", ""), "overlayfs");
  EXPECT_EQ(rec.value("writable_layer", ""), "carried");
  const std::string digest_line = ctr({"image", "ls"}).output;
  const std::string image_digest = rec["containerd"].value("image_digest", "");
  EXPECT_EQ(image_digest.rfind("sha256:", 0), 0u) << image_digest;
  EXPECT_NE(digest_line.find(image_digest), std::string::npos) << digest_line;

  auto r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t back = task_pid(id);
  ASSERT_GT(back, 0) << "containerd does not run the restored task";
  EXPECT_EQ(json::parse(r.out, nullptr, false).value("pid", 0), back);
  // The shim's runc ran gpuckpt's CRIU, which read the images from gpuckpt's streamer.
  EXPECT_EQ(json::parse(r.out, nullptr, false).value("staging_mode", ""), "stream") << r.out;
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);

  const std::string replica = "replica-" + std::to_string(::getpid());
  ctr_ids_.push_back(replica);
  r = test::run_cli({"--json", "restore", ckpt.string(), "--container", replica});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has_stage(r.out, "rootfs_apply")) << r.out;
  const pid_t twin = task_pid(replica);
  ASSERT_GT(twin, 0);
  EXPECT_NE(twin, back);
  EXPECT_EQ(redis(twin, {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  // Its own writable layer, a fresh snapshot with the original's files in it.
  EXPECT_TRUE(has_layer(back));
  EXPECT_TRUE(has_layer(twin)) << "the replica lacks what the original wrote to its rootfs";
  std::ofstream(fs::path("/proc/" + std::to_string(twin) + "/root/etc/written")) << "changed\n";
  EXPECT_TRUE(has_layer(back)) << "the replica shares the original's writable layer";
  const json info = json::parse(ctr({"container", "info", replica}).output, nullptr, false);
  EXPECT_EQ(info.value("Image", ""), kImage);
  EXPECT_EQ(info.value("SnapshotKey", ""), replica);

  r = test::run_cli({"--json", "restore", ckpt.string(), "--container", replica});
  EXPECT_EQ(r.exit_code, 12) << r.out;
  EXPECT_NE(r.out.find("already runs container " + replica), std::string::npos) << r.out;
  EXPECT_EQ(task_pid(replica), twin);

  // A rollback in place: the container changes its files and is dumped again, then comes back
  // from the first checkpoint with that checkpoint's files, not the ones it wrote since.
  std::ofstream(fs::path("/proc/" + std::to_string(back) + "/root/etc/written")) << "later\n";
  // Dumped again: a task that gpuckpt restored is dumped as the first was.
  const auto d2 =
      test::run_cli({"dump", "--container", id, "-o", (dir_.path() / "c2.ckpt").string()});
  ASSERT_EQ(d2.exit_code, 0) << d2.err;
  r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has_stage(r.out, "rootfs_apply")) << r.out;
  ASSERT_GT(task_pid(id), 0);
  EXPECT_TRUE(has_layer(task_pid(id))) << "the rollback kept the files written after the dump";
}

// gpuckpt killed while containerd restores its task, or once that runs before it answered: the
// guard kills the task and deletes it, so containerd runs no half-made copy and the name is
// free; the checkpoint restores afterwards.
TEST_F(E2eRuntimes, AContainerdRestoreKilledAtAnyPointLeavesNoHalfMadeTask) {
  const auto [id, init, digest] = ctr_serving("half");
  ASSERT_GT(init, 0);
  const fs::path ckpt = dir_.path() / "h.ckpt";
  ASSERT_EQ(
      test::run_cli({"dump", "--container", id, "-o", ckpt.string(), "--leave-running"}).exit_code,
      0);
  EXPECT_EQ(task_pid(id), init) << "--leave-running ended the container";
  const std::string copy = "halfcopy-" + std::to_string(::getpid());
  ctr_ids_.push_back(copy);
  // runtime_created: containerd has created the task from the images, not yet started it.
  for (const std::string point : {"criu_restore", "runtime_created", "criu_restored"}) {
    SCOPED_TRACE(point);
    (void)test::signalled_at({"restore", ckpt.string(), "--container", copy}, point, SIGKILL,
                             dir_.path());
    EXPECT_TRUE(test::wait_until([&] {
      return ctr({"task", "ls"}).output.find(copy) == std::string::npos;
    })) << "containerd keeps a task of the half-made copy";
    EXPECT_TRUE(test::wait_until([&] { return !has_container(copy); }))
        << "the record made for the copy stays";
    EXPECT_TRUE(test::wait_until([&] { return test::container_restore_dirs(copy).empty(); }));
    EXPECT_TRUE(test::wait_until([&] { return fs::is_empty(dir_.path() / "ctd-tmp"); }))
        << "containerd's copy of the images is left";
  }
  const auto r = test::run_cli({"restore", ckpt.string(), "--container", copy});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(task_pid(copy), {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(task_pid(id), init);
}

// What containerd cannot take is refused before anything is frozen or started: a dump when its
// containerd does not answer; a restore under a name that runs, or one runc would refuse; a
// restore on a containerd without the image (a spare that never pulled it), which works once
// the image is there, the container record made anew from the checkpoint's.
// containerd keeps what it unpacks of a checkpoint handed to it as content (a Docker restore's);
// the restore removes that copy by the token it put in its images, and nothing else there: not
// another restore's, and not what a link points at.
TEST_F(E2eRuntimes, ContainerdsCopyOfARestoresImagesIsFoundByItsTokenAlone) {
  namespace ctd = container::containerd;
  const fs::path tmp = dir_.path() / "ctd-tmp";
  const std::string token = ctd::new_restore_token();
  ASSERT_EQ(token.size(), 32u);
  EXPECT_NE(ctd::new_restore_token(), token);
  auto copy = [&](const fs::path& d, const std::string& t) {
    fs::create_directories(d);
    std::ofstream(d / ctd::kRestoreTokenFile) << t;
    std::ofstream(d / "pages-1.img") << std::string(4096, 'p');
  };
  copy(tmp / "ctrd-checkpoint1", token);
  copy(tmp / "ctrd-checkpoint2", ctd::new_restore_token());
  copy(tmp / "elsewhere", token);  // not containerd's name
  const fs::path outside = dir_.path() / "outside";
  copy(outside, token);
  fs::create_directory_symlink(outside, tmp / "ctrd-checkpoint3");
  fs::create_directories(tmp / "ctrd-checkpoint4");
  fs::create_symlink(outside / ctd::kRestoreTokenFile,
                     tmp / "ctrd-checkpoint4" / ctd::kRestoreTokenFile);
  EXPECT_EQ(ctd::restore_token_in(tmp / "ctrd-checkpoint4"), "");
  EXPECT_EQ(ctd::restore_token_in(tmp / "ctrd-checkpoint1"), token);

  EXPECT_GE(ctd::remove_unpacked_copies(token), 4096u);
  EXPECT_FALSE(fs::exists(tmp / "ctrd-checkpoint1"));
  for (const char* kept : {"ctrd-checkpoint2", "elsewhere", "ctrd-checkpoint3", "ctrd-checkpoint4"})
    EXPECT_TRUE(fs::exists(fs::symlink_status(tmp / kept))) << kept;
  EXPECT_TRUE(fs::exists(outside / "pages-1.img"));
  EXPECT_EQ(ctd::remove_unpacked_copies(token), 0u);
  EXPECT_EQ(ctd::remove_unpacked_copies(""), 0u);
}

TEST_F(E2eRuntimes, WhatContainerdCannotTakeIsRefusedBeforeAnythingStarts) {
  const auto [id, init, digest] = ctr_serving("bad");
  ASSERT_GT(init, 0);
  write_layer(init);
  address_.emplace("CONTAINERD_ADDRESS", (dir_.path() / "nowhere.sock").string());
  auto r =
      test::run_cli({"--json", "dump", "--container", id, "-o", (dir_.path() / "x.ckpt").string()});
  address_.emplace("CONTAINERD_ADDRESS", sock_.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("Nothing was frozen"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_.path() / "x.ckpt"));
  EXPECT_TRUE(test::runs_again(init));

  const fs::path ckpt = dir_.path() / "b.ckpt";
  ASSERT_EQ(
      test::run_cli({"dump", "--container", id, "-o", ckpt.string(), "--leave-running"}).exit_code,
      0);
  r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  EXPECT_EQ(r.exit_code, 12) << r.out;
  r = test::run_cli({"--json", "restore", ckpt.string(), "--container", "bad id"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(task_pid(id), init);
  EXPECT_EQ(redis(init, {"DEBUG", "DIGEST"}), digest);

  // The container, its snapshot and the image gone, as on a spare.
  ASSERT_TRUE(ctr({"task", "kill", "-s", "SIGKILL", id}).status.ok());
  ASSERT_TRUE(test::wait_until([&] { return ctr({"task", "rm", id}).status.ok(); }));
  ASSERT_TRUE(ctr({"container", "rm", id}).status.ok());
  ASSERT_TRUE(ctr({"image", "rm", "--sync", kImage}).status.ok());
  r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find(std::string("the image ") + kImage), std::string::npos) << r.out;
  EXPECT_FALSE(has_container(id)) << "a refused restore made a container record";

  ASSERT_TRUE(ctr({"image", "import", "--base-name", "localhost/gk-redis",
                   (dir_.path() / "image.tar").string()})
                  .status.ok());
  r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(has_container(id));
  EXPECT_EQ(redis(task_pid(id), {"DEBUG", "DIGEST"}), digest);
  EXPECT_TRUE(has_layer(task_pid(id)));
}

// containerd's shim may run crun instead of runc (`ctr run --runc-binary`, a runtime class or
// a dockerd runtime naming crun): crun's state, under the daemon's root. gpuckpt restores a
// daemon's container through that daemon's shim, which would run crun's restore without
// gpuckpt's CRIU: the container is named for what it is, and refused before the freeze.
TEST_F(E2eRuntimes, AContainerdContainerThatCrunRunsIsNamedAndRefusedBeforeTheFreeze) {
  const auto crun = find_executable("crun");
  if (!crun) GTEST_SKIP() << "crun is not installed (scripts/setup.sh installs it)";
  // crun refuses this machine's hybrid cgroups: a containerd that sees cgroup v2 alone.
  containerd_->kill(SIGTERM);
  containerd_->wait();
  start_containerd(/*cgroup2=*/true);
  // crun's cgroup manager here may not raise RLIMIT_MEMLOCK for a devices program: ctr's own
  // spec without its resources, on the image's layer unpacked.
  json spec = json::parse(run_capture({"ctr", "oci", "spec"}, 60s).output);
  spec["linux"].erase("resources");
  spec["process"]["args"] = kRedisArgs;
  spec["root"] = {{"path", (dir_.path() / "layer").string()}, {"readonly", false}};
  const std::string id = "bycrun-" + std::to_string(::getpid());
  spec["linux"]["cgroupsPath"] = "/" + ns_ + "/" + id;  // ctr's spec names no ID: "/default"
  spec["mounts"].push_back({{"destination", "/usr"},
                            {"type", "bind"},
                            {"source", "/usr"},
                            {"options", {"rbind", "ro"}}});
  const fs::path config = dir_.path() / "crun-spec.json";
  std::ofstream(config) << spec.dump();
  ctr_ids_.push_back(id);
  const RunResult run =
      ctr({"run", "-d", "--runc-binary", crun->string(), "--config", config.string(), id});
  ASSERT_TRUE(run.status.ok()) << run.output << read_file(dir_.path() / "ctr.err");
  pid_t init = 0;
  ASSERT_TRUE(test::wait_until([&] {
    init = task_pid(id);
    return init > 0 && redis(init, {"PING"}) == "PONG";
  }));
  const std::string digest = fill(init);
  const fs::path ckpt = dir_.path() / "crun.ckpt";
  auto r = test::run_cli({"--json", "dump", "--container", id, "-o", ckpt.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  const std::string msg = json::parse(r.out, nullptr, false)["error"].value("message", "");
  EXPECT_NE(msg.find("containerd container " + id), std::string::npos) << msg;
  EXPECT_NE(msg.find("runs under crun"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Nothing was frozen"), std::string::npos) << msg;
  // By a pid of its: the container is named.
  r = test::run_cli({"--json", "dump", "--pid", std::to_string(init), "-o", ckpt.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("containerd container " + id), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(ckpt));
  EXPECT_TRUE(test::runs_again(init));
  EXPECT_EQ(redis(init, {"DEBUG", "DIGEST"}), digest);
}

// containerd's native snapshotter copies the image into a directory, with no overlay upper
// directory to read what the container wrote from: the dump says its writable layer does not
// travel, and the checkpoint restores into its own container only; a new one is refused before
// anything is made.
TEST_F(E2eRuntimes, ALayerThatCannotTravelKeepsTheCheckpointToItsOwnContainer) {
  const auto [id, init, digest] = ctr_serving("native", "native");
  ASSERT_GT(init, 0);
  write_layer(init);
  const fs::path ckpt = dir_.path() / "n.ckpt";
  const auto d = test::run_cli({"dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.err.find("does not travel"), std::string::npos) << d.err;
  const json rec = json::parse(test::run_cli({"--json", "inspect", ckpt.string()}).out, nullptr,
                               false)["extra"]["process"]["container"];
  EXPECT_EQ(rec.value("writable_layer", ""), "not_carried");
  EXPECT_NE(rec.value("writable_layer_why", "").find("native"), std::string::npos) << rec.dump();

  const std::string copy = "ncopy-" + std::to_string(::getpid());
  ctr_ids_.push_back(copy);
  auto r = test::run_cli({"--json", "restore", ckpt.string(), "--container", copy});
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("does not carry the writable layer"), std::string::npos) << r.out;
  EXPECT_FALSE(has_container(copy)) << "a refused restore made a container record";

  r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_GT(task_pid(id), 0);
  EXPECT_EQ(redis(task_pid(id), {"DEBUG", "DIGEST"}), digest);
  EXPECT_TRUE(has_layer(task_pid(id)));
}

// Docker: dumped by its name, the container shows Exited, and comes back as the container
// `docker ps` shows running, with its data; the checkpoint also makes a new container beside it
// (`docker run`'s config, a name of its own).
TEST_F(E2eRuntimes, ADockerContainerComesBackAsTheContainerDockerRuns) {
  if (const std::string why = docker_missing(); !why.empty()) GTEST_SKIP() << why;
  start_docker();
  const auto [name, init, digest] = docker_serving("dkr");
  ASSERT_GT(init, 0);
  ASSERT_EQ(digest.size(), 40u) << digest;
  write_layer(init);
  const fs::path ckpt = dir_.path() / "d.ckpt";
  // A restart policy would have dockerd start it afresh once the dump ends it: refused first.
  ASSERT_TRUE(docker({"update", "--restart", "always", name}).status.ok());
  auto refused = test::run_cli({"--json", "dump", "--container", name, "-o", ckpt.string()});
  EXPECT_EQ(refused.exit_code, 2) << refused.out;
  EXPECT_NE(refused.out.find("restart policy 'always'"), std::string::npos) << refused.out;
  EXPECT_TRUE(test::runs_again(init));
  EXPECT_FALSE(fs::exists(ckpt));
  ASSERT_TRUE(docker({"update", "--restart", "no", name}).status.ok());
  auto d = test::run_cli({"--json", "dump", "--container", name, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const std::string full = trimmed(docker({"inspect", "-f", "{{.Id}}", name}).output);
  EXPECT_EQ(json::parse(d.out, nullptr, false).value("container", ""), full);
  EXPECT_FALSE(process::alive(init));
  EXPECT_EQ(docker_pid(name), 0);
  const json rec = json::parse(test::run_cli({"--json", "inspect", ckpt.string()}).out, nullptr,
                               false)["extra"]["process"]["container"];
  EXPECT_EQ(rec.value("runtime", ""), "docker");
  EXPECT_EQ(rec["docker"].value("name", ""), name);
  EXPECT_EQ(rec["docker"].value("image_id", ""),
            trimmed(docker({"inspect", "-f", "{{.Image}}", name}).output));

  // Not a restore's: left alone by the restores' cleanup.
  const fs::path foreign = dir_.path() / "ctd-tmp" / "ctrd-checkpoint-foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign / "gpuckpt-restore-token") << "0123";
  auto r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has_stage(r.out, "checkpoint_dir")) << r.out;
  // dockerd copies the checkpoint's directory into containerd: the images are unpacked for it,
  // and the directory links to them.
  EXPECT_EQ(json::parse(r.out, nullptr, false).value("staging_mode", ""), "staged") << r.out;
  const pid_t back = docker_pid(name);
  ASSERT_GT(back, 0) << "docker does not show the restored container running";
  EXPECT_EQ(json::parse(r.out, nullptr, false).value("pid", 0), back);
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);

  const std::string replica = "dreplica-" + std::to_string(::getpid());
  docker_names_.push_back(replica);
  r = test::run_cli({"restore", ckpt.string(), "--container", replica});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t twin = docker_pid(replica);
  ASSERT_GT(twin, 0);
  EXPECT_EQ(redis(twin, {"DEBUG", "DIGEST"}), digest);
  EXPECT_TRUE(has_layer(back));
  EXPECT_TRUE(has_layer(twin)) << "the new container lacks what the original wrote to its rootfs";
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  // Moved on this host to a new container, the original ending once the copy answers.
  const std::string moved = "dmoved-" + std::to_string(::getpid());
  docker_names_.push_back(moved);
  const auto m = test::run_cli({"migrate", "--container", replica, "--new-id", moved, "--to",
                                (dir_.path() / "to").string()});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  ASSERT_GT(docker_pid(moved), 0);
  EXPECT_EQ(redis(docker_pid(moved), {"DEBUG", "DIGEST"}), digest);
  EXPECT_TRUE(test::wait_until([&] { return docker_pid(replica) == 0; }));
  // dockerd's checkpoint directories that gpuckpt filled are gone again.
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir_.path() / "docker" / "containers", ec))
    EXPECT_NE(e.path().parent_path().filename(), "checkpoints") << e.path();
  // So are the copies of the images that containerd unpacked for each restore and kept.
  for (const auto& e : fs::directory_iterator(dir_.path() / "ctd-tmp"))
    EXPECT_EQ(e.path(), foreign) << "containerd's copy of a restore's images is left";

  // On a host where another container has its name, a restore under its own ID (which would
  // create it by that name) is refused before anything is made or started.
  ASSERT_TRUE(docker({"rm", "-f", name}).status.ok());
  ASSERT_TRUE(
      docker({"create", "--name", name, "--network", "none", "localhost/gk-redis:d"}).status.ok());
  const std::string other = trimmed(docker({"inspect", "-f", "{{.Id}}", name}).output);
  r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  EXPECT_EQ(r.exit_code, 12) << r.out;
  EXPECT_NE(r.out.find("a container named " + name), std::string::npos) << r.out;
  EXPECT_EQ(trimmed(docker({"inspect", "-f", "{{.Id}} {{.State.Running}}", name}).output),
            other + " false");
}

// gpuckpt killed while Docker restores a new container: before it is made, once dockerd has
// made it with the checkpoint in its checkpoint directory but not started it, inside the start
// call (dockerd has the request, its runc restores), and once it runs restored but gpuckpt has
// not taken it. Each leaves no container by that name, no checkpoint (nor containerd's copy of it)
// directory and no restore bundle; the original runs on, and the restore then works.
TEST_F(E2eRuntimes, ADockerRestoreKilledAtAnyPointLeavesNoHalfMadeContainer) {
  if (const std::string why = docker_missing(); !why.empty()) GTEST_SKIP() << why;
  start_docker();
  const auto [name, init, digest] = docker_serving("dhalf");
  ASSERT_GT(init, 0);
  const fs::path ckpt = dir_.path() / "dh.ckpt";
  ASSERT_EQ(test::run_cli({"dump", "--container", name, "-o", ckpt.string(), "--leave-running"})
                .exit_code,
            0);
  const std::string copy = "dhalfcopy-" + std::to_string(::getpid());
  docker_names_.push_back(copy);
  auto checkpoint_dirs = [&] {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e :
         fs::recursive_directory_iterator(dir_.path() / "docker" / "containers", ec))
      if (e.path().parent_path().filename() == "checkpoints") out.push_back(e.path());
    return out;
  };
  for (const std::string point :
       {"criu_restore", "runtime_created", "runtime_starting", "criu_restored"}) {
    SCOPED_TRACE(point);
    (void)test::signalled_at({"restore", ckpt.string(), "--container", copy}, point, SIGKILL,
                             dir_.path());
    EXPECT_TRUE(test::wait_until([&] {
      return !docker({"inspect", copy}).status.ok();
    })) << "Docker keeps the half-made container "
        << copy;
    std::vector<fs::path> left;
    EXPECT_TRUE(test::wait_until([&] { return (left = checkpoint_dirs()).empty(); }))
        << left.front();
    EXPECT_TRUE(test::wait_until([&] { return test::container_restore_dirs(copy).empty(); }));
    EXPECT_TRUE(test::wait_until([&] { return fs::is_empty(dir_.path() / "ctd-tmp"); }))
        << "containerd's copy of the images is left";
  }
  const auto r = test::run_cli({"restore", ckpt.string(), "--container", copy});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_GT(docker_pid(copy), 0);
  EXPECT_EQ(redis(docker_pid(copy), {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(docker_pid(name), init);

  // In place of the dumped container (its record kept, not made for the restore), killed once
  // dockerd has the start: the guard waits for that start to end, ends what it brought up and
  // removes containerd's copy, then drops its journal.
  const fs::path run = dir_.path() / "run";
  const test::ScopedEnv run_dir("GPUCKPT_RUN_DIR", run.string());
  const fs::path ended = dir_.path() / "dh-ended.ckpt";
  ASSERT_EQ(test::run_cli({"dump", "--container", name, "-o", ended.string()}).exit_code, 0);
  ASSERT_TRUE(test::wait_until([&] { return docker_pid(name) == 0; }));
  auto journals = [&] {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run, ec))
      if (e.path().filename().string().starts_with(".restore-")) out.push_back(e.path());
    return out;
  };
  Child g =
      test::paused_cli({"restore", ended.string(), "--container"}, "runtime_starting", dir_.path());
  ASSERT_EQ(journals().size(), 1u) << "no journal while the restore runs";
  // What dockerd copies into containerd's content store, and containerd out again, is links to
  // the images gpuckpt staged, not their pages; the other files (runc's descriptors.json) are
  // files.
  const auto dirs = checkpoint_dirs();
  ASSERT_EQ(dirs.size(), 1u);
  bool pages = false;
  for (const auto& e : fs::directory_iterator(dirs[0])) {
    const bool image = e.path().extension() == ".img";
    EXPECT_EQ(e.is_symlink(), image) << e.path();
    EXPECT_TRUE(fs::is_regular_file(e.path())) << e.path() << " leads nowhere";
    pages |= e.path().filename().string().starts_with("pages-");
  }
  EXPECT_TRUE(pages);
  g.kill(SIGKILL);
  g.wait();
  EXPECT_TRUE(test::wait_until([&] { return journals().empty(); })) << "the guard's journal stays";
  EXPECT_EQ(docker_pid(name), 0) << "the start that gpuckpt did not see through left it running";
  EXPECT_TRUE(fs::is_empty(dir_.path() / "ctd-tmp")) << "containerd's copy of the images is left";
  const auto back = test::run_cli({"restore", ended.string(), "--container"});
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(redis(docker_pid(name), {"DEBUG", "DIGEST"}), digest);
}

// dockerd's CRIU reads its options from /etc/criu/runc.conf alone: a checkpoint with CUDA state
// (here the test driver's, tests/support/fake_cuda_driver.cpp) is refused before dockerd makes
// or starts anything, unless gpuckpt's plugin is in the libdir named there (else
// /usr/lib/criu); a migration of such a container, here or over ssh, is refused before its
// freeze.
TEST_F(E2eRuntimes, ADockerRestoreOfCudaStateNeedsGpuckptsPluginWhereDockersCriuLoadsIt) {
  if (const std::string why = docker_missing(); !why.empty()) GTEST_SKIP() << why;
  std::ifstream conf("/etc/criu/runc.conf");
  const std::string text((std::istreambuf_iterator<char>(conf)), std::istreambuf_iterator<char>());
  if (text.find("libdir") != std::string::npos ||
      fs::exists("/usr/lib/criu/gpuckpt_criu_plugin.so"))
    GTEST_SKIP() << "dockerd's CRIU may load gpuckpt's plugin here: no refusal to see";
  start_docker();
  // Two processes that the test driver takes for CUDA workers, in a Docker container.
  const fs::path dev = dir_.path() / "fake-dev";
  fs::create_directories(dev / "cuda");
  std::ofstream(dev / "nvidia0") << "stands for /dev/nvidia0\n";
  std::ofstream(dev / "version")
      << "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  (test driver)\n";
  const fs::path worker = GPUCKPT_FAKE_CUDA_WORKER;
  const std::string name = "dcuda-" + std::to_string(::getpid());
  docker_names_.push_back(name);
  const RunResult run = docker({"run", "-d", "--name", name, "--network", "none", "-v",
                                "/usr:/usr:ro", "-v", worker.parent_path().string() + ":/fake:ro",
                                "-v", dev.string() + ":/fake-dev:ro", "localhost/gk-redis:d",
                                "/fake/" + worker.filename().string(), "/fake-dev/nvidia0", "2"});
  ASSERT_TRUE(run.status.ok()) << run.output << read_file(dir_.path() / "docker.err");
  pid_t init = 0;
  ASSERT_TRUE(test::wait_until([&] {
    init = docker_pid(name);
    if (init <= 0) return false;
    std::vector<pid_t> all{init};
    for (pid_t p : test::descendants(init)) all.push_back(p);
    return all.size() == 2 && std::all_of(all.begin(), all.end(), [](pid_t p) {
             return test::FakeCudaTree::restore_thread(p) != 0;
           });
  }));
  test::ScopedEnv lib("GPUCKPT_LIBCUDA", GPUCKPT_FAKE_CUDA_DRIVER);
  test::ScopedEnv module("GPUCKPT_TEST_NVIDIA_VERSION_FILE", (dev / "version").string());
  test::ScopedEnv prefix("GPUCKPT_PLUGIN_TEST_DEVICE_PREFIX", "/fake-dev/nvidia0");
  test::ScopedEnv state("GPUCKPT_FAKE_CUDA_DIR", (dev / "cuda").string());
  // A migration is refused before the freeze: its copy would be Docker's to restore.
  const auto m = test::run_cli({"--json", "migrate", "--container", name, "--new-id",
                                name + "-copy", "--to", (dir_.path() / "dcm").string()});
  EXPECT_EQ(m.exit_code, 2) << m.out << m.err;
  EXPECT_NE(m.out.find("ln -s "), std::string::npos) << m.out;
  EXPECT_EQ(docker_pid(name), init) << "the migration's refusal came after the freeze";
  EXPECT_TRUE(test::runs_again(init));
  // Over ssh the target's own dockerd and CRIU configuration decide, and it refuses before
  // it says it receives: nothing here is frozen.
  test::close_inherited_fds();
  const test::NetNs host("dkrgpu");
  const test::SshHost ssh(host, dir_.path() / "ssh", "spare", "",
                          {"DOCKER_HOST=unix://" + docker_sock_.string()});
  const auto s =
      test::run_cli({"--json", "migrate", "--container", name, "--new-id", name + "-there", "--to",
                     ssh.url(), "--ssh-config", ssh.config().string(), "--remote-gpuckpt",
                     test::gpuckpt_binary().string(), "--spool", dir_.path().string()});
  EXPECT_EQ(s.exit_code, 2) << s.out << s.err;
  EXPECT_NE(s.out.find("gpuckpt_criu_plugin.so"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("nothing was frozen"), std::string::npos) << s.out;
  EXPECT_EQ(docker_pid(name), init) << "the target's refusal came after the freeze";
  EXPECT_TRUE(test::runs_again(init));
  const fs::path ckpt = dir_.path() / "dc.ckpt";
  const auto d = test::run_cli({"--json", "dump", "--container", name, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(json::parse(d.out, nullptr, false).value("gpu", false), true) << d.out;

  const auto r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  const json err = json::parse(r.out, nullptr, false);
  const std::string says = err.is_object() ? err["error"].value("message", "") : r.out;
  EXPECT_NE(says.find("ln -s "), std::string::npos) << says;
  EXPECT_NE(says.find("gpuckpt_criu_plugin.so"), std::string::npos) << says;
  // Nothing started: the container stays as the dump left it, and the checkpoint is whole.
  EXPECT_EQ(docker_pid(name), 0);
  EXPECT_EQ(test::run_cli({"verify", ckpt.string()}).exit_code, 0);
}

// A migration on this host: the containerd container moves to a new ID while the original stays
// frozen until the copy answers, then ends; containerd keeps the original's record, task gone.
TEST_F(E2eRuntimes, AContainerdContainerMigratesOnThisHostToANewId) {
  const auto [id, init, digest] = ctr_serving("mig");
  ASSERT_GT(init, 0);
  const std::string copy = "migcopy-" + std::to_string(::getpid());
  ctr_ids_.push_back(copy);
  const auto m = test::run_cli({"--json", "migrate", "--container", id, "--new-id", copy, "--to",
                                (dir_.path() / "to").string()});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  const pid_t moved = task_pid(copy);
  ASSERT_GT(moved, 0);
  EXPECT_EQ(redis(moved, {"DEBUG", "DIGEST"}), digest);
  EXPECT_FALSE(process::alive(init));
  EXPECT_TRUE(test::wait_until([&] { return task_pid(id) == 0; }));
  EXPECT_TRUE(has_container(id));
}

// A pod's container as containerd's CRI makes one (ctr run --with-ns: the pod's network, ipc
// and uts namespaces by its sandbox's pid, /proc/PAUSE/ns/net). A replica in another pod
// joins each of that pod's namespaces through the container record made for it; under the
// original's own record, whose spec names the first pod's, --join-ns is refused, and the
// original comes back into its pod.
TEST_F(E2eRuntimes, AContainerdPodsContainerIsReplicatedIntoAnotherPod) {
  const test::PodSandbox a("gk-ctd-a"), b("gk-ctd-b");
  a.make_sysv_segment();  // the pod's: neither made again in it nor carried into pod b
  const auto [id, init, digest] =
      ctr_serving("ctdpod", "overlayfs",
                  {"--with-ns", "network:" + a.ns_path("net"), "--with-ns",
                   "ipc:" + a.ns_path("ipc"), "--with-ns", "uts:" + a.ns_path("uts")});
  ASSERT_GT(init, 0);
  ASSERT_EQ(a.outside(init), "");
  const fs::path ckpt = dir_.path() / "pod.ckpt";
  const auto d = test::run_cli({"dump", "--container", id, "-o", ckpt.string()});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_TRUE(test::wait_until([&] { return task_pid(id) == 0; }));

  const std::vector<std::string> into_b{"--join-ns", "network=" + b.ns_path("net"),
                                        "--join-ns", "ipc=" + b.ns_path("ipc"),
                                        "--join-ns", "uts=" + b.ns_path("uts")};
  std::vector<std::string> args{"--json", "restore", ckpt.string(), "--container"};
  args.insert(args.end(), into_b.begin(), into_b.end());
  auto r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("keeps the namespaces its record names"), std::string::npos) << r.out;
  EXPECT_EQ(task_pid(id), 0);

  const std::string replica = "podrep-" + std::to_string(::getpid());
  ctr_ids_.push_back(replica);
  args = {"--json", "restore", ckpt.string(), "--container", replica};
  args.insert(args.end(), into_b.begin(), into_b.end());
  r = test::run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t twin = task_pid(replica);
  ASSERT_GT(twin, 0);
  EXPECT_EQ(b.outside(twin), "") << "the replica is outside pod b's namespaces";
  EXPECT_EQ(redis(twin, {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(b.hostname(), "gk-ctd-b\n") << "the restore renamed pod b";
  EXPECT_EQ(b.sysv_segments(), 0u) << "pod a's SysV segment was carried into pod b";

  r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const pid_t back = task_pid(id);
  ASSERT_GT(back, 0);
  EXPECT_EQ(a.outside(back), "") << "restored outside pod a's namespaces";
  EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
  EXPECT_EQ(a.sysv_segments(), 1u);
  EXPECT_EQ(a.hostname(), "gk-ctd-a\n");
}

// A planned move to a spare over ssh (the other host is a network namespace with its own sshd,
// whose sessions reach containerd through CONTAINERD_ADDRESS, as an operator configures it): the
// copy comes back there as a task containerd runs in a new container record, answering its probe
// inside its own network namespace, and the original's task ends here.
TEST_F(E2eRuntimes, AContainerdContainerMovesToAnotherHostOverSsh) {
  const auto [id, init, digest] = ctr_serving("ssh");
  ASSERT_GT(init, 0);
  write_layer(init);
  test::close_inherited_fds();
  const test::NetNs host("ctdhost");
  const test::SshHost ssh(host, dir_.path() / "ssh", "spare", "",
                          {"CONTAINERD_ADDRESS=" + sock_.string()});
  const fs::path remote_spool = dir_.path() / "remote-spool";
  fs::create_directories(remote_spool);
  const std::string copy = "there-" + std::to_string(::getpid());
  ctr_ids_.push_back(copy);
  const auto m = test::run_cli(
      {"--json", "migrate", "--container", id, "--new-id", copy, "--to", ssh.url(), "--ssh-config",
       ssh.config().string(), "--remote-gpuckpt", test::gpuckpt_binary().string(), "--remote-spool",
       remote_spool.string(), "--spool", dir_.path().string(), "--probe",
       "tcp:127.0.0.1:" + std::to_string(kRedisPort)});
  ASSERT_EQ(m.exit_code, 0) << m.err << m.out;
  const json j = json::parse(m.out, nullptr, false);
  EXPECT_EQ(j["target_result"].value("container", ""), copy);
  const pid_t there = task_pid(copy);
  ASSERT_GT(there, 0) << "containerd does not run the copy";
  EXPECT_EQ(redis(there, {"DEBUG", "DIGEST"}), digest);
  EXPECT_TRUE(has_layer(there));
  EXPECT_FALSE(process::alive(init));
  EXPECT_TRUE(test::wait_until([&] { return task_pid(id) == 0; }));
}

// gpuckpt interrupted or killed while it dumps a containerd container: the container runs on,
// with its data, and containerd still runs its task; killed once the checkpoint is durable, it
// ends as planned, and its restore in place deletes the task containerd still holds.
TEST_F(E2eRuntimes, ASignalAtAnyPhaseOfAContainerdDumpLeavesItsTaskRunning) {
  const auto [id, init, digest] = ctr_serving("fault");
  ASSERT_GT(init, 0);
  const fs::path ckpt = dir_.path() / "f.ckpt";
  for (const auto& [point, sig] : std::vector<std::pair<std::string, int>>{
           {"criu_dump", SIGKILL}, {"compress_write", SIGINT}, {"compress_write", SIGKILL}}) {
    SCOPED_TRACE(point + " / " + strsignal(sig));
    EXPECT_FALSE(test::signalled_at({"dump", "--container", id, "-o", ckpt.string()}, point, sig,
                                    dir_.path())
                     .exited);
    EXPECT_TRUE(test::runs_again(init)) << "the container was left frozen";
    EXPECT_EQ(task_pid(id), init);
    EXPECT_TRUE(test::wait_until([&] { return redis(init, {"DEBUG", "DIGEST"}) == digest; }));
    EXPECT_TRUE(test::wait_until([&] { return !fs::exists(ckpt); }));
    EXPECT_TRUE(test::wait_unlocked(init)) << "the guard never finished its recovery";
  }
  (void)test::signalled_at({"dump", "--container", id, "-o", ckpt.string()}, "durable", SIGKILL,
                           dir_.path());
  EXPECT_TRUE(test::wait_until([&] { return !process::alive(init); }));
  const auto r = test::run_cli({"restore", ckpt.string(), "--container"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(redis(task_pid(id), {"DEBUG", "DIGEST"}), digest);
}

// The same move for a Docker container: the target's dockerd (reached through DOCKER_HOST)
// creates the copy from the recorded config and starts it from the images.
TEST_F(E2eRuntimes, ADockerContainerMovesToAnotherHostOverSsh) {
  if (const std::string why = docker_missing(); !why.empty()) GTEST_SKIP() << why;
  start_docker();
  const auto [name, init, digest] = docker_serving("dssh");
  ASSERT_GT(init, 0);
  write_layer(init);
  test::close_inherited_fds();
  const test::NetNs host("dkrhost");
  const test::SshHost ssh(host, dir_.path() / "ssh", "spare", "",
                          {"DOCKER_HOST=unix://" + docker_sock_.string()});
  const std::string copy = "dthere-" + std::to_string(::getpid());
  docker_names_.push_back(copy);
  const auto m = test::run_cli(
      {"--json", "migrate", "--container", name, "--new-id", copy, "--to", ssh.url(),
       "--ssh-config", ssh.config().string(), "--remote-gpuckpt", test::gpuckpt_binary().string(),
       "--spool", dir_.path().string(), "--probe", "tcp:127.0.0.1:" + std::to_string(kRedisPort)});
  ASSERT_EQ(m.exit_code, 0) << m.err << m.out;
  const pid_t there = docker_pid(copy);
  ASSERT_GT(there, 0) << "docker does not show the copy running";
  EXPECT_EQ(redis(there, {"DEBUG", "DIGEST"}), digest);
  EXPECT_TRUE(has_layer(there));
  EXPECT_FALSE(process::alive(init));
  EXPECT_TRUE(test::wait_until([&] { return docker_pid(name) == 0; }));
}

// dockerd gives each container a /dev/shm of its own: a tmpfs in its spec (IPC mode "private",
// the default), or one it mounts itself and binds in ("shareable", older daemons' default), and
// unmounts once the container ends. Either way, what the container kept there comes back with
// it, in a tmpfs of the size it was given, in place and in a replica, each with its own.
TEST_F(E2eRuntimes, WhatADockerContainerKeptInItsDevShmComesBackWithIt) {
  if (const std::string why = docker_missing(); !why.empty()) GTEST_SKIP() << why;
  start_docker();
  const auto shm = [](pid_t pid) {
    return fs::path("/proc/" + std::to_string(pid) + "/root/dev/shm");
  };
  const auto size_of = [](const fs::path& dir) {
    struct statvfs st {};
    return ::statvfs(dir.c_str(), &st) == 0 ? st.f_blocks * st.f_frsize : 0;
  };
  for (const std::string mode : {"private", "shareable"}) {
    SCOPED_TRACE(mode);
    const auto [name, init, digest] =
        docker_serving("dshm-" + mode, {"--ipc", mode, "--shm-size", "48m"});
    ASSERT_GT(init, 0);
    ASSERT_EQ(size_of(shm(init)), 48u << 20);
    std::ofstream(shm(init) / "kept") << "in the container's /dev/shm\n";
    const fs::path ckpt = dir_.path() / (mode + ".ckpt");
    auto d = test::run_cli({"--json", "dump", "--container", name, "-o", ckpt.string()});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    auto r = test::run_cli({"--json", "restore", ckpt.string(), "--container"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const pid_t back = docker_pid(name);
    ASSERT_GT(back, 0);
    EXPECT_EQ(redis(back, {"DEBUG", "DIGEST"}), digest);
    EXPECT_EQ(read_file(shm(back) / "kept"), "in the container's /dev/shm\n");
    EXPECT_EQ(size_of(shm(back)), 48u << 20);
    if (mode != "shareable") continue;
    const std::string replica = "dshmr-" + std::to_string(::getpid());
    docker_names_.push_back(replica);
    r = test::run_cli({"restore", ckpt.string(), "--container", replica});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const pid_t twin = docker_pid(replica);
    ASSERT_GT(twin, 0);
    EXPECT_EQ(read_file(shm(twin) / "kept"), "in the container's /dev/shm\n");
    std::ofstream(shm(twin) / "twin") << "x";
    EXPECT_FALSE(fs::exists(shm(back) / "twin")) << "the replica shares its /dev/shm";
  }
}
