#include "container/record.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cctype>

#include "container/docker.h"
#include "container/pod.h"
#include "gpuckpt/error.h"
#include "trust/keys.h"

using nlohmann::json;

namespace gpuckpt::container {

namespace {

WritableLayer layer_from(const std::string& s) {
  for (const auto l : {WritableLayer::kNone, WritableLayer::kEmpty, WritableLayer::kCarried,
                       WritableLayer::kNotCarried, WritableLayer::kRootfs})
    if (s == writable_layer_name(l)) return l;
  throw Error(Errc::kCorrupt, "unknown writable layer '" + s + "' in the container record");
}

Runtime runtime_from(const std::string& s) {
  if (s == "runc") return Runtime::kRunc;
  if (s == "docker") return Runtime::kDocker;
  if (s == "containerd") return Runtime::kContainerd;
  if (s == "crun") return Runtime::kCrun;
  throw Error(Errc::kCorrupt, "unknown container runtime '" + s + "' in the container record");
}

}  // namespace

std::optional<DirIdentity> dir_identity(const std::string& path) {
  struct statx stx {};
  if (::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_TYPE | STATX_INO | STATX_BTIME,
              &stx) != 0 ||
      !S_ISDIR(stx.stx_mode))
    return std::nullopt;
  DirIdentity d{makedev(stx.stx_dev_major, stx.stx_dev_minor), stx.stx_ino, 0};
  if (stx.stx_mask & STATX_BTIME)
    d.btime_ns = stx.stx_btime.tv_sec * 1000000000LL + stx.stx_btime.tv_nsec;
  return d;
}

bool valid_id(const std::string& id) {
  if (id.empty() || id == "." || id == ".." || id.size() > 1024) return false;
  return std::all_of(id.begin(), id.end(), [](unsigned char ch) {
    return std::isalnum(ch) || ch == '_' || ch == '+' || ch == '-' || ch == '.';
  });
}

json to_json(const ContainerRecord& r) {
  json mounts = json::array();
  for (const auto& m : r.mounts) {
    mounts.push_back({{"destination", m.destination}, {"source", m.source}});
    if (m.outside_spec) mounts.back()["outside_spec"] = true;
  }
  json j = {{"runtime", container_runtime_name(r.runtime)},
            {"root", r.root},
            {"id", r.id},
            {"bundle", r.bundle},
            {"rootfs", r.rootfs},
            {"spec", r.spec},
            {"stdio", r.stdio},
            {"mounts", mounts},
            {"network", {{"own", r.own_network}, {"loopback_up", r.loopback_up}}},
            {"writable_layer", writable_layer_name(r.layer)}};
  if (!r.layer_why.empty()) j["writable_layer_why"] = r.layer_why;
  if (const auto& o = r.rootfs_origin)
    j["rootfs_origin"] = {{"token", o->token},
                          {"boot_id", o->boot_id},
                          {"dev", o->dir.dev},
                          {"ino", o->dir.ino},
                          {"btime_ns", o->dir.btime_ns}};
  for (const auto& [type, n] : r.joined) {
    j["joined_namespaces"][type] = {{"inode", n.inode}};
    if (!n.boot_id.empty())
      j["joined_namespaces"][type].update(
          {{"boot_id", n.boot_id}, {"holder_started", n.holder_started}});
  }
  if (const auto& c = r.containerd)
    j["containerd"] = {
        {"namespace", c->ns},
        {"image", c->image},
        {"image_digest", c->image_digest},
        {"labels", c->labels},
        {"runtime", c->runtime},
        {"options_type", c->options_type},
        {"options", trust::to_base64(reinterpret_cast<const unsigned char*>(c->options.data()),
                                     c->options.size())},
        {"snapshotter", c->snapshotter},
        {"snapshot_parent", c->snapshot_parent},
        {"sandbox", c->sandbox}};
  if (r.runtime == Runtime::kCrun) j["crun"] = {{"cgroup_manager", r.cgroup_manager}};
  if (const auto& d = r.docker)
    j["docker"] = {{"name", d->name},
                   {"config", d->config},
                   {"host_config", d->host_config},
                   {"image_id", d->image_id}};
  return j;
}

json target_check_json(const ContainerRecord& r) {
  json j = to_json(r);
  // Of the spec, only the namespaces the container joined by path, which must be there too.
  j["spec"] = json::object();
  for (const auto& [type, path] : joined_namespaces(r.spec))
    j["spec"]["linux"]["namespaces"].push_back({{"type", type}, {"path", path}});
  if (j.contains("containerd")) {
    j["containerd"]["labels"] = json::object();
    j["containerd"]["options"] = "";
  }
  if (j.contains("docker")) {
    j["docker"]["config"] = {{"Image", docker::string_at(r.docker->config, {"Image"})}};
    j["docker"]["host_config"] = json::object();
  }
  return j;
}

ContainerRecord container_record_from_json(const json& j) {
  try {
    ContainerRecord r;
    r.runtime = runtime_from(j.at("runtime").get<std::string>());
    r.root = j.at("root").get<std::string>();
    r.id = j.at("id").get<std::string>();
    if (!valid_id(r.id)) throw Error(Errc::kCorrupt, "the container record's ID is no runc ID");
    r.bundle = j.value("bundle", "");
    r.rootfs = j.at("rootfs").get<std::string>();
    r.spec = j.at("spec");
    if (!r.spec.is_object()) throw Error(Errc::kCorrupt, "the container record has no OCI spec");
    // Its namespaces are read wherever the record is (the restore's checks, inspect).
    if (r.spec.contains("linux") && r.spec["linux"].contains("namespaces"))
      for (const auto& ns : r.spec["linux"].at("namespaces"))
        if (!ns.is_object() || !ns.at("type").is_string() ||
            (ns.contains("path") && !ns["path"].is_string()))
          throw Error(Errc::kCorrupt,
                      "the container record's spec names a namespace malformed: " + ns.dump());
    r.stdio = j.value("stdio", std::vector<std::string>{});
    for (const auto& m : j.value("mounts", json::array()))
      r.mounts.push_back({m.at("destination").get<std::string>(), m.at("source").get<std::string>(),
                          m.value("outside_spec", false)});
    if (j.contains("network")) {
      r.own_network = j["network"].value("own", false);
      r.loopback_up = j["network"].value("loopback_up", false);
    }
    const json joined = j.value("joined_namespaces", json::object());
    for (const auto& [type, n] : joined.items())
      r.joined[type] = {n.at("inode").get<std::uint64_t>(), n.value("boot_id", ""),
                        n.value("holder_started", std::uint64_t{0})};
    if (j.contains("writable_layer")) {
      r.layer = layer_from(j["writable_layer"].get<std::string>());
      r.layer_why = j.value("writable_layer_why", "");
      if (r.layer == WritableLayer::kRootfs) {
        if (!runs_bundles(r.runtime))
          throw Error(Errc::kCorrupt,
                      "the container record carries a whole rootfs, which only a bundle's "
                      "container (runc's, crun's) does");
        const json& o = j.at("rootfs_origin");
        r.rootfs_origin = RootfsOrigin{
            o.at("token").get<std::string>(), o.value("boot_id", ""),
            DirIdentity{o.value("dev", std::uint64_t{0}), o.value("ino", std::uint64_t{0}),
                        o.value("btime_ns", std::int64_t{0})}};
        if (r.rootfs_origin->token.empty() || r.rootfs.empty() || r.rootfs[0] != '/')
          throw Error(Errc::kCorrupt,
                      "the container record carries a rootfs without its token or an absolute "
                      "path to unpack it at");
      }
    } else if (j.value("rootfs_diff", false)) {  // recorded by gpuckpt before 2026-12-06
      r.layer = WritableLayer::kCarried;
    } else if (!runs_bundles(r.runtime)) {
      r.layer = WritableLayer::kEmpty;
    }
    if (j.contains("containerd")) {
      const json& c = j["containerd"];
      ContainerdRecord d;
      d.ns = c.at("namespace").get<std::string>();
      d.image = c.value("image", "");
      d.image_digest = c.value("image_digest", "");
      d.labels = c.value("labels", std::map<std::string, std::string>{});
      d.runtime = c.at("runtime").get<std::string>();
      d.options_type = c.value("options_type", "");
      const std::string b64 = c.value("options", "");
      const std::size_t pad = std::count(b64.begin(), b64.end(), '=');
      if (b64.size() % 4 != 0 || pad > 2)
        throw Error(Errc::kCorrupt, "the containerd runtime options are not base64");
      const auto raw = trust::from_base64(b64, b64.size() / 4 * 3 - pad);
      if (!raw) throw Error(Errc::kCorrupt, "the containerd runtime options are not base64");
      d.options.assign(raw->begin(), raw->end());
      d.snapshotter = c.at("snapshotter").get<std::string>();
      d.snapshot_parent = c.value("snapshot_parent", "");
      d.sandbox = c.value("sandbox", "");
      r.containerd = std::move(d);
    }
    if (j.contains("docker"))
      r.docker = DockerRecord{j["docker"].at("name").get<std::string>(), j["docker"].at("config"),
                              j["docker"].at("host_config"), j["docker"].value("image_id", "")};
    if (r.runtime == Runtime::kCrun) {
      r.cgroup_manager = j.at("crun").at("cgroup_manager").get<std::string>();
      if (r.cgroup_manager != "cgroupfs" && r.cgroup_manager != "systemd" &&
          r.cgroup_manager != "disabled")
        throw Error(Errc::kCorrupt, "unknown crun cgroup manager '" + r.cgroup_manager +
                                        "' in the container record");
    }
    if ((r.runtime == Runtime::kContainerd && !r.containerd) ||
        (r.runtime == Runtime::kDocker && !r.docker))
      throw Error(Errc::kCorrupt, std::string("the container record lacks its ") +
                                      container_runtime_name(r.runtime) + " part");
    return r;
  } catch (const json::exception& e) {
    throw Error(Errc::kCorrupt, std::string("malformed container record: ") + e.what());
  }
}

}  // namespace gpuckpt::container

namespace gpuckpt {

const char* writable_layer_name(WritableLayer l) {
  switch (l) {
    case WritableLayer::kEmpty:
      return "empty";
    case WritableLayer::kCarried:
      return "carried";
    case WritableLayer::kNotCarried:
      return "not_carried";
    case WritableLayer::kRootfs:
      return "rootfs";
    case WritableLayer::kNone:
      break;
  }
  return "none";
}

const char* container_runtime_name(ContainerRuntime r) {
  switch (r) {
    case ContainerRuntime::kDocker:
      return "docker";
    case ContainerRuntime::kContainerd:
      return "containerd";
    case ContainerRuntime::kCrun:
      return "crun";
    case ContainerRuntime::kRunc:
      break;
  }
  return "runc";
}

}  // namespace gpuckpt
