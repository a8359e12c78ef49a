#include "criu/plugin_report.h"

#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt::criu {

const PluginHook* PluginReport::find(const std::string& name) const {
  for (const auto& h : hooks)
    if (h.name == name) return &h;
  return nullptr;
}

const PluginHook* PluginReport::last_to_end(const std::string& name) const {
  const PluginHook* last = nullptr;
  for (const auto& h : hooks)
    if (h.name == name && (!last || h.end_ns > last->end_ns)) last = &h;
  return last;
}

bool PluginReport::all_ok() const {
  for (const auto& h : hooks)
    if (!h.ok) return false;
  return true;
}

std::string PluginReport::first_error() const {
  for (const auto& h : hooks)
    if (!h.ok) return h.name + " (pid " + std::to_string(h.pid) + "): " + h.error;
  return {};
}

std::string to_json_text(const PluginReport& r) {
  json hooks = json::array();
  for (const auto& h : r.hooks) {
    hooks.push_back({{"name", h.name},
                     {"pid", h.pid},
                     {"start_ns", h.start_ns},
                     {"end_ns", h.end_ns},
                     {"seconds", h.seconds()},
                     {"ok", h.ok},
                     {"skipped", h.skipped},
                     {"error", h.error}});
  }
  json j{{"version", r.version},     {"stage", r.stage}, {"api_available", r.api_available},
         {"api_error", r.api_error}, {"cuda", r.cuda},   {"cuda_pids", r.cuda_pids},
         {"gpu_map", r.gpu_map},     {"hooks", hooks},   {"criu_result", r.criu_result},
         {"finished", r.finished}};
  j["driver_library"] = r.driver_library;
  j["driver_load_seconds"] = r.driver_load_seconds;
  j["cuinit_seconds"] = r.cuinit_seconds;
  j["interrupt_only"] = r.interrupt_only;
  j["locked_pids"] = r.locked_pids;
  j["together"] = r.together;
  return j.dump(2) + "\n";
}

PluginReport parse_plugin_report(const std::string& text) {
  try {
    const json j = json::parse(text);
    PluginReport r;
    r.version = j.at("version").get<int>();
    r.stage = j.at("stage").get<std::string>();
    r.api_available = j.value("api_available", false);
    r.api_error = j.value("api_error", "");
    r.cuda = j.value("cuda", false);
    r.cuda_pids = j.value("cuda_pids", std::vector<pid_t>{});
    r.gpu_map = j.value("gpu_map", "");
    r.criu_result = j.value("criu_result", 0);
    r.finished = j.value("finished", false);
    // Added later: reports of older plugins lack them.
    r.driver_library = j.value("driver_library", "");
    r.driver_load_seconds = j.value("driver_load_seconds", 0.0);
    r.cuinit_seconds = j.value("cuinit_seconds", 0.0);
    r.interrupt_only = j.value("interrupt_only", false);
    r.locked_pids = j.value("locked_pids", std::vector<pid_t>{});
    r.together = j.value("together", 0);
    for (const auto& h : j.at("hooks")) {
      PluginHook ph;
      ph.name = h.at("name").get<std::string>();
      ph.pid = h.value("pid", 0);
      ph.start_ns = h.at("start_ns").get<std::int64_t>();
      ph.end_ns = h.at("end_ns").get<std::int64_t>();
      ph.ok = h.value("ok", true);
      ph.skipped = h.value("skipped", false);
      ph.error = h.value("error", "");
      r.hooks.push_back(std::move(ph));
    }
    return r;
  } catch (const json::exception& e) {
    throw Error(Errc::kCriu, std::string("malformed CRIU plugin report: ") + e.what());
  }
}

std::optional<PluginReport> read_plugin_report(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  return parse_plugin_report(read_file(path));
}

}  // namespace gpuckpt::criu
