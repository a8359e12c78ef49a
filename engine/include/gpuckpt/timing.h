// Per-stage wall-clock timing. Every operation (dump, restore, migrate, pack, ...) returns a
// Timeline; it is written into the checkpoint manifest and into --json output.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace gpuckpt {

struct Stage {
  std::string name;         // stable identifier, e.g. "freeze", "criu_dump", "compress_write"
  double seconds = 0;       // wall-clock duration
  std::uint64_t bytes = 0;  // bytes moved by the stage (0 if not meaningful)
  double start_offset = 0;  // seconds since the timeline started (stages may overlap)

  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  Timeline() : origin_(Clock::now()) {}

  // RAII scope: records the stage when destroyed (also on exception, so a failure report
  // still shows how far it got).
  class Scope {
   public:
    Scope(Timeline& t, std::string name) : t_(t), name_(std::move(name)), start_(Clock::now()) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() { t_.add(name_, start_, Clock::now(), bytes_); }
    void set_bytes(std::uint64_t b) { bytes_ = b; }

   private:
    Timeline& t_;
    std::string name_;
    Clock::time_point start_;
    std::uint64_t bytes_ = 0;
  };

  Scope scope(std::string name) { return Scope(*this, std::move(name)); }
  void add(const std::string& name, Clock::time_point start, Clock::time_point end,
           std::uint64_t bytes = 0);
  // For stages measured elsewhere (the CRIU plugin, a child process).
  void add_measured(const std::string& name, double seconds, std::uint64_t bytes = 0);
  // Appends another timeline's stages, shifted to where `other` started relative to this one.
  void append(const Timeline& other);

  const std::vector<Stage>& stages() const { return stages_; }
  const Stage* find(const std::string& name) const;
  double total_seconds() const;  // wall clock from origin to the end of the last stage
  Clock::time_point origin() const { return origin_; }

 private:
  Clock::time_point origin_;
  std::vector<Stage> stages_;
};

// The one JSON shape of a timeline (the CLI's --json, the report, the checkpoint's record):
// {"total_seconds", "stages": [{"name", "seconds", "start", "bytes", "gbps"}, ...]}.
nlohmann::json timeline_json(const Timeline& t);

// The one reader of that shape, strict: a stage without a name, a duration that is not a
// finite non-negative number, or negative bytes is refused as Error(kInvalidInput) whose
// message starts with `source`. A stage without "start" follows the ones before it.
Timeline timeline_from_json(const nlohmann::json& j, const std::string& source);
Timeline timeline_from_json(const nlohmann::ordered_json& j, const std::string& source);

}  // namespace gpuckpt
