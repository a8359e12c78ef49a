#include "context.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>

namespace gpuckpt::cli {

namespace {
std::mutex g_progress_mu;
bool g_progress_drawn = false;
}  // namespace

std::string human_bytes(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

ProgressFn Context::progress() const {
  if (quiet || json || !::isatty(STDERR_FILENO)) return {};
  return [last = std::make_shared<std::chrono::steady_clock::time_point>()](const Progress& p) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(g_progress_mu);
    if (now - *last < std::chrono::milliseconds(100) && p.done_bytes != p.total_bytes) return;
    *last = now;
    const double gbps = p.elapsed_seconds > 0 ? p.done_bytes / p.elapsed_seconds / 1e9 : 0;
    std::string total = p.total_bytes ? " / " + human_bytes(p.total_bytes) : "";
    std::fprintf(stderr, "\r\033[K%-10s %s%s  %.2f GB/s", p.phase.c_str(),
                 human_bytes(p.done_bytes).c_str(), total.c_str(), gbps);
    std::fflush(stderr);
    g_progress_drawn = true;
  };
}

void Context::progress_done() const {
  std::lock_guard lock(g_progress_mu);
  if (g_progress_drawn) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    g_progress_drawn = false;
  }
}

void Context::emit(const nlohmann::json& j) const {
  std::cout << json_text(j, 2) << std::endl;
}

void Context::emit_ordered(const nlohmann::ordered_json& j) const {
  std::cout << json_text(j, 2) << std::endl;
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_text(const nlohmann::ordered_json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

nlohmann::json signature_json(const SignatureInfo& s) {
  nlohmann::json j = {{"state", signature_state_name(s.state)}};
  if (s.state == SignatureState::kUnsigned) return j;
  j["key_id"] = s.key_id;
  j["public_key"] = s.public_key;
  if (s.state == SignatureState::kInvalid) {
    j["problem"] = s.problem;
  } else {
    j["trusted"] = s.trusted();
    j["trusted_by"] = s.trusted() ? nlohmann::json(s.trusted_by.string()) : nlohmann::json();
  }
  return j;
}

std::string signature_text(const SignatureInfo& s, const std::filesystem::path& trusted_keys) {
  switch (s.state) {
    case SignatureState::kUnsigned:
      return "unsigned";
    case SignatureState::kInvalid:
      return "INVALID (key " + s.key_id + "): " + s.problem;
    case SignatureState::kValid:
      break;
  }
  std::string t = "valid, by key " + s.key_id;
  if (s.trusted()) return t + " (trusted: " + s.trusted_by.string() + ")";
  if (trusted_keys.empty()) return t + " (no trusted keys configured)";
  return t + " (NOT among the trusted keys in " + trusted_keys.string() + ")";
}

void print_stages(const Timeline& t) {
  std::printf("%-22s %12s %14s %10s\n", "stage", "time", "bytes", "GB/s");
  for (const auto& s : t.stages()) {
    std::printf("%-22s %12s %14s %10s\n", s.name.c_str(), format_seconds(s.seconds).c_str(),
                s.bytes ? human_bytes(s.bytes).c_str() : "-",
                s.bytes && s.seconds > 0 ? std::to_string(s.gbps()).substr(0, 6).c_str() : "-");
  }
  std::printf("%-22s %12s\n", "total (wall clock)", format_seconds(t.total_seconds()).c_str());
}

}  // namespace gpuckpt::cli
