#include "gpuckpt/timing.h"

#include <algorithm>

namespace gpuckpt {

namespace {
double secs(Timeline::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

void Timeline::add(const std::string& name, Clock::time_point start, Clock::time_point end,
                   std::uint64_t bytes) {
  stages_.push_back({name, secs(end - start), bytes, secs(start - origin_)});
}

void Timeline::add_measured(const std::string& name, double seconds, std::uint64_t bytes) {
  // Placed after the last recorded stage: measured elsewhere, we only know its length.
  double at = 0;
  for (const auto& s : stages_) at = std::max(at, s.start_offset + s.seconds);
  stages_.push_back({name, seconds, bytes, at});
}

void Timeline::append(const Timeline& other) {
  const double shift = secs(other.origin_ - origin_);
  for (Stage s : other.stages_) {
    s.start_offset += shift;
    stages_.push_back(std::move(s));
  }
}

const Stage* Timeline::find(const std::string& name) const {
  auto it =
      std::find_if(stages_.begin(), stages_.end(), [&](const Stage& s) { return s.name == name; });
  return it == stages_.end() ? nullptr : &*it;
}

double Timeline::total_seconds() const {
  double end = 0;
  for (const auto& s : stages_) end = std::max(end, s.start_offset + s.seconds);
  return end;
}

nlohmann::json timeline_json(const Timeline& t) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : t.stages())
    stages.push_back({{"name", s.name},
                      {"seconds", s.seconds},
                      {"start", s.start_offset},
                      {"bytes", s.bytes},
                      {"gbps", s.gbps()}});
  return {{"total_seconds", t.total_seconds()}, {"stages", stages}};
}

}  // namespace gpuckpt
