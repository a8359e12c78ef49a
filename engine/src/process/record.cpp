#include "process/record.h"

#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"

using nlohmann::json;

namespace gpuckpt::process {

namespace {

json stages_json(const Timeline& t) {
  json stages = json::array();
  for (const auto& s : t.stages())
    stages.push_back(
        {{"name", s.name}, {"seconds", s.seconds}, {"start", s.start_offset}, {"bytes", s.bytes}});
  return {{"total_seconds", t.total_seconds()}, {"stages", stages}};
}

}  // namespace

std::string timeline_json(const Timeline& t) {
  return stages_json(t).dump();
}

std::string to_extra_json(const ProcessRecord& r) {
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
         {"tree", r.tree},
         {"cuda_pids", r.cuda_pids},
         {"tcp", {{"listener", r.tcp_listener}, {"established", r.tcp_established}}},
         {"unix_listeners", r.unix_listeners},
         {"dump_timeline", stages_json(r.timeline)}};
  return json{{"process", p}}.dump();
}

std::optional<ProcessRecord> from_extra_json(const std::string& extra_json) {
  if (extra_json.empty()) return std::nullopt;
  try {
    const json j = json::parse(extra_json);
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
    // The dump timeline is informational; it is not read back into r.timeline.
    return r;
  } catch (const json::exception& e) {
    throw Error(Errc::kCorrupt,
                std::string("malformed process record in the manifest: ") + e.what());
  }
}

}  // namespace gpuckpt::process
