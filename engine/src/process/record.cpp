#include "process/record.h"

#include <nlohmann/json.hpp>

#include "container/docker.h"
#include "container/pod.h"
#include "gpuckpt/error.h"
#include "gpuckpt/process.h"

using nlohmann::json;

namespace gpuckpt::process {

namespace {

json gpus_json(const std::vector<RecordedGpu>& gpus) {
  json a = json::array();
  for (const auto& g : gpus)
    a.push_back({{"uuid", g.uuid},
                 {"name", g.name},
                 {"compute_capability", {g.compute_major, g.compute_minor}},
                 {"total_memory", g.total_memory},
                 {"process_memory", g.process_memory}});
  return a;
}

std::vector<RecordedGpu> gpus_from(const json& p, const std::vector<std::string>& uuids) {
  std::vector<RecordedGpu> out;
  if (!p.contains("gpus")) {  // an older record: the UUIDs are all there is
    for (const auto& u : uuids) out.push_back(RecordedGpu{u});
    return out;
  }
  for (const auto& g : p.at("gpus")) {
    RecordedGpu r;
    r.uuid = g.at("uuid").get<std::string>();
    r.name = g.value("name", "");
    if (g.contains("compute_capability")) {
      const auto& cc = g.at("compute_capability");
      r.compute_major = cc.at(0).get<int>();
      r.compute_minor = cc.at(1).get<int>();
    }
    r.total_memory = g.value("total_memory", std::uint64_t{0});
    r.process_memory = g.value("process_memory", std::uint64_t{0});
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

json to_extra(const ProcessRecord& r) {
  json p{{"version", r.version},
         {"pid", r.pid},
         {"comm", r.comm},
         {"cmdline", r.cmdline},
         {"exe", r.exe},
         {"hostname", r.hostname},
         {"shell_job", r.shell_job},
         {"leave_running", r.leave_running},
         {"criu", {{"version", r.criu_version}, {"dump_args", r.criu_args}}},
         {"cuda", r.cuda},
         {"gpu_uuids", r.gpu_uuids},
         {"gpus", gpus_json(r.gpus)},
         {"driver", r.driver ? json{{"module_version", r.driver->module_version},
                                    {"library", r.driver->library},
                                    {"library_sha256", r.driver->library_sha256}}
                             : json()},
         {"tree", r.tree},
         {"cuda_pids", r.cuda_pids},
         {"tcp", {{"listener", r.tcp_listener}, {"established", r.tcp_established}}},
         {"unix_listeners", r.unix_listeners},
         {"dump_timeline", timeline_json(r.timeline)}};
  if (r.container) p["container"] = container::to_json(*r.container);
  return json{{"process", p}};
}

std::optional<ProcessRecord> from_extra(const json& j) {
  try {
    if (!j.is_object() || !j.contains("process")) return std::nullopt;
    const json& p = j.at("process");
    ProcessRecord r;
    r.version = p.at("version").get<int>();
    r.pid = p.at("pid").get<pid_t>();
    r.comm = p.value("comm", "");
    r.cmdline = p.value("cmdline", std::vector<std::string>{});
    r.exe = p.value("exe", "");
    r.hostname = p.value("hostname", "");
    r.shell_job = p.value("shell_job", false);
    r.leave_running = p.value("leave_running", false);
    if (p.contains("criu")) {
      r.criu_version = p["criu"].value("version", "");
      r.criu_args = p["criu"].value("dump_args", std::vector<std::string>{});
    }
    r.cuda = p.value("cuda", false);
    r.gpu_uuids = p.value("gpu_uuids", std::vector<std::string>{});
    r.gpus = gpus_from(p, r.gpu_uuids);
    if (p.contains("driver") && !p.at("driver").is_null()) {
      const json& d = p.at("driver");
      r.driver = device::DriverIdentity{d.at("module_version").get<std::string>(),
                                        d.at("library").get<std::string>(),
                                        d.at("library_sha256").get<std::string>()};
    }
    r.tree = p.value("tree", std::vector<pid_t>{});
    if (r.tree.empty()) r.tree.push_back(r.pid);  // records of single-process dumps
    r.cuda_pids = p.value("cuda_pids", std::vector<pid_t>{});
    r.unix_listeners = p.value("unix_listeners", std::vector<std::string>{});
    if (p.contains("tcp")) {
      r.tcp_listener = p["tcp"].value("listener", false);
      r.tcp_established = p["tcp"].value("established", "closed");
      if (r.tcp_established != "closed" && r.tcp_established != "established")
        throw Error(Errc::kCorrupt, "unknown tcp.established mode '" + r.tcp_established + "'");
    }
    if (p.contains("container"))
      r.container = container::container_record_from_json(p.at("container"));
    // The dump timeline is informational; it is not read back into r.timeline.
    return r;
  } catch (const json::exception& e) {
    throw Error(Errc::kCorrupt,
                std::string("malformed process record in the manifest: ") + e.what());
  }
}

}  // namespace gpuckpt::process

namespace gpuckpt {

std::optional<ContainerSummary> container_summary(const nlohmann::json& extra) {
  // The container's part alone: what else the process record holds is not shown with it.
  if (!extra.is_object() || !extra.contains("process") || !extra["process"].is_object() ||
      !extra["process"].contains("container"))
    return std::nullopt;
  const container::ContainerRecord r =
      container::container_record_from_json(extra["process"]["container"]);
  ContainerSummary s;
  s.runtime = r.runtime;
  s.id = r.id;
  s.root = r.root;
  s.bundle = r.bundle;
  s.rootfs = r.rootfs;
  if (const auto& c = r.containerd) {
    s.image = c->image;
    s.image_digest = c->image_digest;
    s.ns = c->ns;
    s.snapshotter = c->snapshotter;
  }
  if (const auto& d = r.docker) {
    s.image = container::docker::string_at(d->config, {"Image"});
    s.image_digest = d->image_id;
    s.name = d->name;
  }
  s.layer = r.layer;
  s.layer_why = r.layer_why;
  if (r.runtime != ContainerRuntime::kDocker)
    for (const auto& [type, path] : container::joined_namespaces(r.spec))
      s.joins.push_back({type, path, pod_namespace_from(type).has_value()});
  for (const auto& m : r.mounts) s.mounts.emplace_back(m.destination, m.source);
  return s;
}

}  // namespace gpuckpt
