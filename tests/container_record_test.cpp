// The container record as a checkpoint keeps it, and as a migration's target reads it before
// anything is frozen: what each must hold, and what it must refuse.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <string>

#include "container/checkpoint.h"
#include "container/docker.h"
#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "process/proc_info.h"
#include "process/record.h"
#include "test_support.h"
#include "util/subprocess.h"

namespace gpuckpt {
namespace {

namespace fs = std::filesystem;
using container::ContainerRecord;
using gpuckpt::WritableLayer;
using nlohmann::json;

ContainerRecord containerd_record() {
  ContainerRecord r;
  r.runtime = container::Runtime::kContainerd;
  r.root = "/run/containerd/runc/k8s.io";
  r.id = "llm-0";
  r.rootfs = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/llm-0/rootfs";
  r.mounts = {{"/models", "/srv/models"}, {"/dev/nvidia0", "/dev/nvidia0"}};
  r.layer = WritableLayer::kCarried;
  container::ContainerdRecord d;
  d.ns = "k8s.io";
  d.image = "registry.local/llm:1";
  d.image_digest = "sha256:" + std::string(64, 'a');
  d.runtime = "io.containerd.runc.v2";
  d.snapshotter = "overlayfs";
  d.snapshot_parent = "sha256:" + std::string(64, 'b');
  // What a serving pod carries: a large spec and many labels.
  for (int i = 0; i < 2000; ++i) d.labels["label-" + std::to_string(i)] = std::string(64, 'x');
  d.options = std::string(4096, '\x01');
  r.containerd = d;
  r.spec = {{"ociVersion", "1.0.2"}, {"process", {{"env", json::array()}}}};
  for (int i = 0; i < 3000; ++i)
    r.spec["process"]["env"].push_back("VAR_" + std::to_string(i) + "=" + std::string(64, 'v'));
  return r;
}

TEST(ContainerRecord, WhatTheTargetChecksFitsOneCommandLineArgumentWhateverTheSpec) {
  const ContainerRecord r = containerd_record();
  ASSERT_GT(container::to_json(r).dump().size(), 128u * 1024) << "the test's record is too small";
  const json j = container::target_check_json(r);
  EXPECT_LT(j.dump().size(), 8u * 1024) << j.dump().substr(0, 400);
  const ContainerRecord back = container::container_record_from_json(j);
  EXPECT_EQ(back.runtime, r.runtime);
  EXPECT_EQ(back.id, r.id);
  EXPECT_EQ(back.root, r.root);
  EXPECT_EQ(back.rootfs, r.rootfs);
  ASSERT_EQ(back.mounts.size(), 2u);
  EXPECT_EQ(back.mounts[0].source, "/srv/models");
  EXPECT_EQ(back.layer, WritableLayer::kCarried);
  ASSERT_TRUE(back.containerd);
  EXPECT_EQ(back.containerd->ns, "k8s.io");
  EXPECT_EQ(back.containerd->image, r.containerd->image);
  EXPECT_EQ(back.containerd->snapshotter, "overlayfs");
  EXPECT_EQ(back.containerd->snapshot_parent, r.containerd->snapshot_parent);
}

// A pod's container: the namespace it joined reaches the target's check, which refuses it where
// it is missing; --join-ns is refused, before any runtime is asked, for a namespace that the
// container did not join (its own, the host's) and for Docker's.
TEST(ContainerRecord, ThePodsNamespacesAreCheckedOnTheTargetAndJoinNsOnlyForThoseItJoined) {
  ContainerRecord r = containerd_record();
  r.spec["linux"]["namespaces"] = json::array(
      {{{"type", "pid"}}, {{"type", "network"}, {"path", "/run/netns/gpuckpt-no-such-pod"}}});
  const ContainerRecord back =
      container::container_record_from_json(container::target_check_json(r));
  EXPECT_EQ(container::joined_network(back), "/run/netns/gpuckpt-no-such-pod");
  Error e = test::error_from([&] { container::check_restore_target(back, "llm-1"); });
  EXPECT_EQ(e.code(), Errc::kInvalidInput) << e.what();
  EXPECT_NE(std::string(e.what()).find("/run/netns/gpuckpt-no-such-pod"), std::string::npos);
  EXPECT_NE(std::string(e.what()).find("--join-ns"), std::string::npos) << e.what();

  // A CRI pod's container shares the pod's ipc and uts too: moved by its network alone it
  // would be split across two pods.
  r.spec["linux"]["namespaces"] = json::array({{{"type", "network"}, {"path", "/proc/self/ns/net"}},
                                               {{"type", "ipc"}, {"path", "/proc/self/ns/ipc"}},
                                               {{"type", "uts"}, {"path", "/proc/self/ns/uts"}}});
  const PodNamespaces net_only{{PodNamespace::kNetwork, "/proc/self/ns/net"}};
  e = test::error_from([&] { container::check_restore_target(r, "llm-1", net_only); });
  EXPECT_EQ(e.code(), Errc::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("ipc namespace /proc/self/ns/ipc"), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("--join-ns ipc=PATH"), std::string::npos) << e.what();
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to make a pod's namespaces";
  const test::PodSandbox pod("gk-rec");
  PodNamespaces all{{PodNamespace::kNetwork, pod.netns_path()},
                    {PodNamespace::kIpc, pod.ns_path("ipc")},
                    {PodNamespace::kUts, pod.ns_path("uts")}};
  // A checkpoint whose images hold the pod's ipc and uts (gpuckpt's before they were left to
  // the pod) would set them inside the pod it joins.
  e = test::error_from([&] { container::check_joined_namespaces(r, all); });
  EXPECT_EQ(e.code(), Errc::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("dump it again"), std::string::npos) << e.what();
  r.joined = {{"network", {}}, {"ipc", {}}, {"uts", {}}};
  EXPECT_NO_THROW(container::check_joined_namespaces(r, all));
  // /proc/self names whoever opens it: runc would put the container into the host's.
  PodNamespaces host = all;
  host[PodNamespace::kIpc] = "/proc/self/ns/ipc";
  e = test::error_from([&] { container::check_joined_namespaces(r, host); });
  EXPECT_EQ(e.code(), Errc::kInvalidInput) << e.what();
  EXPECT_NE(std::string(e.what()).find("gpuckpt itself runs in"), std::string::npos) << e.what();
  // Each is checked for its type: a uts namespace is no ipc one.
  all[PodNamespace::kIpc] = "/proc/self/ns/uts";
  e = test::error_from([&] { container::check_joined_namespaces(r, all); });
  EXPECT_EQ(e.code(), Errc::kInvalidInput) << e.what();
  EXPECT_NE(std::string(e.what()).find("no ipc namespace"), std::string::npos) << e.what();
  all[PodNamespace::kIpc] = "proc/self/ns/ipc";
  e = test::error_from([&] { container::check_joined_namespaces(r, all); });
  EXPECT_EQ(e.code(), Errc::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("absolute"), std::string::npos) << e.what();

  r.spec["linux"]["namespaces"] = json::array({{{"type", "network"}}});
  r.own_network = true;
  EXPECT_EQ(container::joined_network(r), "");
  e = test::error_from([&] { container::check_restore_target(r, "llm-1", net_only); });
  EXPECT_EQ(e.code(), Errc::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("its own"), std::string::npos) << e.what();
  e = test::error_from([&] {
    container::check_restore_target(r, "llm-1", {{PodNamespace::kUts, "/proc/self/ns/uts"}});
  });
  EXPECT_EQ(e.code(), Errc::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("the host's uts namespace"), std::string::npos) << e.what();

  ContainerRecord d;
  d.runtime = container::Runtime::kDocker;
  d.id = std::string(64, 'c');
  d.spec = {{"linux", {{"namespaces", json::array({{{"type", "network"}, {"path", "/x"}}})}}}};
  e = test::error_from([&] { container::check_restore_target(d, "web", net_only); });
  EXPECT_EQ(e.code(), Errc::kUsage) << e.what();
  EXPECT_NE(std::string(e.what()).find("dockerd"), std::string::npos) << e.what();
}

// containerd names a CRI pod's namespaces by its sandbox's pid (/proc/PAUSE/ns/ipc). Once the
// pod is made again, or on another host, that pid is another process's: a restore that joined
// its namespaces would put the container into an unrelated process's. What the dump recorded
// of the namespace and of the process holding it tells.
TEST(ContainerRecord, APodsNamespaceNamedByAPidThatNowNamesAnotherIsRefused) {
  Child holder = spawn({"sleep", "600"});
  const std::string ipc = "/proc/" + std::to_string(holder.pid()) + "/ns/ipc";
  auto inode_of = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
  };
  // By a thread of it, too.
  const std::string by_task =
      "/proc/" + std::to_string(holder.pid()) + "/task/" + std::to_string(holder.pid()) + "/ns/ipc";
  ContainerRecord r = containerd_record();
  r.spec["linux"]["namespaces"] = json::array(
      {{{"type", "ipc"}, {"path", ipc}}, {{"type", "uts"}, {"path", "/proc/thread-self/ns/uts"}}});
  const auto started = process::start_ticks(holder.pid());
  ASSERT_TRUE(started);
  r.joined = {{"ipc", {inode_of(ipc), boot_id(), *started}},
              {"uts", {inode_of("/proc/thread-self/ns/uts"), "", 0}}};
  ASSERT_NE(r.joined["ipc"].inode, 0u);
  ASSERT_NE(r.joined["uts"].inode, 0u);
  const ContainerRecord back =
      container::container_record_from_json(container::target_check_json(r));
  EXPECT_EQ(back.joined, r.joined);
  EXPECT_NO_THROW(container::check_joined_namespaces(back, {}));

  auto refused = [&](const ContainerRecord& rec, const std::string& path) {
    SCOPED_TRACE(path);
    const Error e = test::error_from([&] { container::check_joined_namespaces(rec, {}); });
    EXPECT_EQ(e.code(), Errc::kInvalidInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(path + " is no longer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--join-ns"), std::string::npos) << e.what();
  };
  ContainerRecord other = r;
  other.joined["ipc"].holder_started += 1;  // another process, in the same namespace
  refused(other, ipc);
  other = r;
  other.joined["ipc"].boot_id = "another-boot";
  refused(other, ipc);
  other = r;
  other.spec["linux"]["namespaces"][0]["path"] = by_task;
  EXPECT_NO_THROW(container::check_joined_namespaces(other, {}));
  other.joined["ipc"].holder_started += 1;
  refused(other, by_task);
  other = r;
  other.joined["uts"].inode += 1;  // a path of no process: its namespace alone tells
  refused(other, "/proc/thread-self/ns/uts");
  // Through links an operator made, it is the process at their end that is checked.
  const TempDir links = test::scratch_dir();
  fs::create_symlink(ipc, links.path() / "ipc");
  fs::create_directory_symlink("/proc/" + std::to_string(holder.pid()), links.path() / "pod");
  for (const fs::path& link : {links.path() / "ipc", links.path() / "pod" / "ns" / "ipc"}) {
    other = r;
    other.spec["linux"]["namespaces"][0]["path"] = link.string();
    EXPECT_NO_THROW(container::check_joined_namespaces(other, {})) << link;
    other.joined["ipc"].holder_started += 1;
    refused(other, link.string());
  }
  // Named in its new pod, it is that pod's that is checked.
  if (::geteuid() == 0) {
    const test::PodSandbox pod("gk-rec2");
    EXPECT_NO_THROW(container::check_joined_namespaces(
        other,
        {{PodNamespace::kIpc, pod.ns_path("ipc")}, {PodNamespace::kUts, pod.ns_path("uts")}}));
  }
  holder.kill(SIGKILL);
  holder.wait();
  const Error gone = test::error_from([&] { container::check_joined_namespaces(r, {}); });
  EXPECT_EQ(gone.code(), Errc::kInvalidInput) << gone.what();
  EXPECT_NE(std::string(gone.what()).find(ipc), std::string::npos) << gone.what();
}

TEST(ContainerRecord, DockersImageAndNameReachTheTargetWithoutItsConfig) {
  ContainerRecord r;
  r.runtime = container::Runtime::kDocker;
  r.root = "/run/docker/runtime-runc/moby";
  r.id = std::string(64, 'c');
  r.rootfs = "/var/lib/docker/overlay2/x/merged";
  r.spec = json::object();
  r.docker = container::DockerRecord{
      "web",
      {{"Image", "localhost/web:1"}, {"Env", json::array({std::string(200000, 'e')})}},
      {{"Binds", json::array()}},
      "sha256:" + std::string(64, 'd')};
  const json j = container::target_check_json(r);
  EXPECT_LT(j.dump().size(), 4u * 1024);
  const ContainerRecord back = container::container_record_from_json(j);
  ASSERT_TRUE(back.docker);
  EXPECT_EQ(back.docker->name, "web");
  EXPECT_EQ(back.docker->image_id, r.docker->image_id);
  EXPECT_EQ(container::docker::string_at(back.docker->config, {"Image"}), "localhost/web:1");
}

TEST(ContainerRecord, ARecordOfAnOlderGpuckptKeepsWhatItSaidOfTheLayer) {
  json j = container::to_json(containerd_record());
  j.erase("writable_layer");
  j["rootfs_diff"] = true;
  EXPECT_EQ(container::container_record_from_json(j).layer, WritableLayer::kCarried);
  j["rootfs_diff"] = false;
  EXPECT_EQ(container::container_record_from_json(j).layer, WritableLayer::kEmpty);
  j["runtime"] = "runc";
  j.erase("containerd");
  EXPECT_EQ(container::container_record_from_json(j).layer, WritableLayer::kNone);
}

TEST(ContainerRecord, ALayerItDoesNotKnowIsACorruptRecord) {
  json j = container::to_json(containerd_record());
  j["writable_layer"] = "somewhere";
  const Error e = test::error_from([&] { (void)container::container_record_from_json(j); });
  EXPECT_EQ(e.code(), Errc::kCorrupt);
  j["writable_layer"] = 3;
  EXPECT_EQ(test::error_from([&] { (void)container::container_record_from_json(j); }).code(),
            Errc::kCorrupt);
}

TEST(ContainerRecord, AWholeRootfsIsCarriedForABundlesContainerOnly) {
  json j = container::to_json(containerd_record());
  j["writable_layer"] = "rootfs";
  const Error e = test::error_from([&] { (void)container::container_record_from_json(j); });
  EXPECT_EQ(e.code(), Errc::kCorrupt);
  EXPECT_NE(std::string(e.what()).find("only a bundle's container (runc's, crun's)"),
            std::string::npos)
      << e.what();
  j["runtime"] = "runc";
  j.erase("containerd");
  // Without the token that tells its own unpacked copy from another.
  EXPECT_EQ(test::error_from([&] { (void)container::container_record_from_json(j); }).code(),
            Errc::kCorrupt);
  j["rootfs_origin"] = {{"token", "ab12"}, {"boot_id", "b"}, {"dev", 1}, {"ino", 2}};
  j["rootfs"] = "rootfs";  // relative: unpacked nobody knows where
  EXPECT_EQ(test::error_from([&] { (void)container::container_record_from_json(j); }).code(),
            Errc::kCorrupt);
  j["rootfs"] = "/srv/bundle/rootfs";
  const ContainerRecord back = container::container_record_from_json(j);
  EXPECT_EQ(back.layer, WritableLayer::kRootfs);
  ASSERT_TRUE(back.rootfs_origin);
  EXPECT_EQ(back.rootfs_origin->token, "ab12");
  EXPECT_EQ(back.rootfs_origin->boot_id, "b");
  EXPECT_EQ(back.rootfs_origin->dir, (container::DirIdentity{1, 2, 0}));
  EXPECT_STREQ(container::layer_file(back.layer), "rootfs.tar");
  EXPECT_EQ(container::container_record_from_json(container::target_check_json(back)).layer,
            WritableLayer::kRootfs);
  // crun's bundles too, with the cgroup manager its restore needs.
  j["runtime"] = "crun";
  EXPECT_EQ(test::error_from([&] { (void)container::container_record_from_json(j); }).code(),
            Errc::kCorrupt);
  j["crun"] = {{"cgroup_manager", "cgroupv3"}};
  EXPECT_EQ(test::error_from([&] { (void)container::container_record_from_json(j); }).code(),
            Errc::kCorrupt);
  j["crun"]["cgroup_manager"] = "systemd";
  const ContainerRecord crun = container::container_record_from_json(j);
  EXPECT_EQ(crun.runtime, ContainerRuntime::kCrun);
  EXPECT_EQ(crun.layer, WritableLayer::kRootfs);
  EXPECT_EQ(crun.cgroup_manager, "systemd");
  EXPECT_EQ(container::container_record_from_json(container::to_json(crun)).cgroup_manager,
            "systemd");
}

TEST(ContainerRecord, ALayerThatDidNotTravelSaysWhy) {
  ContainerRecord r = containerd_record();
  r.layer = WritableLayer::kNotCarried;
  r.layer_why = "containerd's snapshotter native gives its snapshot no overlay upper directory";
  const ContainerRecord back = container::container_record_from_json(container::to_json(r));
  EXPECT_EQ(back.layer, WritableLayer::kNotCarried);
  EXPECT_EQ(back.layer_why, r.layer_why);
}

TEST(ContainerRecord, ItsSummaryShowsTheContainerAndWhichOfThePodsNamespacesMove) {
  ContainerRecord r = containerd_record();
  r.spec["linux"]["namespaces"] = json::array({{{"type", "pid"}},
                                               {{"type", "network"}, {"path", "/proc/42/ns/net"}},
                                               {{"type", "ipc"}, {"path", "/proc/42/ns/ipc"}},
                                               {{"type", "cgroup"}, {"path", "/run/cg"}}});
  process::ProcessRecord p;
  p.pid = 7;
  p.container = r;
  const auto s = container_summary(process::to_extra(p));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->runtime, ContainerRuntime::kContainerd);
  EXPECT_EQ(s->id, "llm-0");
  EXPECT_EQ(s->image, r.containerd->image);
  EXPECT_EQ(s->image_digest, r.containerd->image_digest);
  EXPECT_EQ(s->ns, "k8s.io");
  EXPECT_EQ(s->layer, WritableLayer::kCarried);
  ASSERT_EQ(s->joins.size(), 3u);
  EXPECT_EQ(s->joins[0].type, "network");
  EXPECT_TRUE(s->joins[0].movable);
  EXPECT_EQ(s->joins[1].path, "/proc/42/ns/ipc");
  EXPECT_TRUE(s->joins[1].movable);
  EXPECT_EQ(s->joins[2].type, "cgroup");
  EXPECT_FALSE(s->joins[2].movable) << "--join-ns cannot move a cgroup namespace";
  ASSERT_EQ(s->mounts.size(), 2u);
  EXPECT_EQ(s->mounts[0].first, "/models");
  EXPECT_EQ(s->mounts[0].second, "/srv/models");

  // dockerd makes a Docker container's namespaces: nothing for --join-ns to name.
  ContainerRecord d;
  d.runtime = container::Runtime::kDocker;
  d.id = std::string(64, 'c');
  d.spec = r.spec;
  d.layer = WritableLayer::kNotCarried;
  d.layer_why = "Docker's storage driver gives it no overlay upper directory";
  d.docker = container::DockerRecord{
      "web", {{"Image", "localhost/web:1"}}, json::object(), "sha256:" + std::string(64, 'd')};
  p.container = d;
  const auto ds = container_summary(process::to_extra(p));
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->name, "web");
  EXPECT_EQ(ds->image, "localhost/web:1");
  EXPECT_EQ(ds->image_digest, d.docker->image_id);
  EXPECT_EQ(ds->layer_why, d.layer_why);
  EXPECT_TRUE(ds->joins.empty());

  p.container.reset();
  EXPECT_FALSE(container_summary(process::to_extra(p))) << "a bare process tree's checkpoint";
  EXPECT_FALSE(container_summary(json::object()));
  json bad = process::to_extra(p);
  bad["process"]["container"] = {{"runtime", "lxc"}};
  EXPECT_THROW(container_summary(bad), Error);
  // A namespace of another shape is a corrupt record, not an exception of the JSON library.
  bad["process"]["container"] = container::to_json(r);
  bad["process"]["container"]["spec"]["linux"]["namespaces"].push_back({{"type", 3}});
  try {
    (void)container_summary(bad);
    ADD_FAILURE() << "a malformed namespace was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kCorrupt) << e.what();
  }

  // Only the container's part is read: the rest of the process record may be of a gpuckpt
  // that wrote what this one does not know.
  json other = process::to_extra(p);
  other["process"]["tcp"]["established"] = "some future mode";
  EXPECT_FALSE(container_summary(other));
  other["process"]["container"] = container::to_json(r);
  const auto shown = container_summary(other);
  ASSERT_TRUE(shown);
  EXPECT_EQ(shown->id, "llm-0");

  // Recorded by gpuckpt before 2026-12-06: a layer carried said as "rootfs_diff".
  other["process"]["container"].erase("writable_layer");
  other["process"]["container"]["rootfs_diff"] = true;
  EXPECT_EQ(container_summary(other)->layer, WritableLayer::kCarried);
}

// dockerd's answers are input: a field of another shape (null where an object was, a number
// where a string was) reads as absent, never as an exception that escapes the command.
TEST(DockerAnswer, AFieldOfAnotherShapeReadsAsAbsent) {
  const json a = json::parse(R"({"Id": 7, "GraphDriver": {"Name": "vfs", "Data": null},
                                 "State": {"Running": "yes"}, "Name": "/web"})");
  EXPECT_EQ(container::docker::string_at(a, {"GraphDriver", "Data", "UpperDir"}), "");
  EXPECT_EQ(container::docker::string_at(a, {"Id"}), "");
  EXPECT_FALSE(container::docker::flag_at(a, {"State", "Running"}));
  EXPECT_EQ(container::docker::string_at(a, {"Name"}), "/web");
  EXPECT_TRUE(container::docker::object_at(a, {"GraphDriver", "Data"}).empty());
  EXPECT_EQ(container::docker::string_at(json(), {"Id"}), "");
}

}  // namespace
}  // namespace gpuckpt
