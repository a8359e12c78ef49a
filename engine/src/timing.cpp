#include "gpuckpt/timing.h"

#include <algorithm>
#include <cmath>

#include "gpuckpt/error.h"

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

namespace {

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(Errc::kInvalidInput, source + ": " + what);
}

template <typename Json>
double number(const Json& j, const char* key, const std::string& source, bool required) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) bad(source, std::string("missing number '") + key + "'");
    return 0;
  }
  if (!j[key].is_number() || !std::isfinite(j[key].template get<double>()))
    bad(source, std::string("'") + key + "' is not a number");
  return j[key].template get<double>();
}

template <typename Json>
Timeline read_timeline(const Json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("stages") || !j["stages"].is_array())
    bad(source, "a timeline needs a 'stages' array");
  Timeline t;
  using D = Timeline::Clock::duration;
  const auto at = [&](double s) {
    return t.origin() + std::chrono::round<D>(std::chrono::duration<double>(s));
  };
  for (const auto& s : j["stages"]) {
    if (!s.is_object() || !s.contains("name") || !s["name"].is_string() ||
        s["name"].template get<std::string>().empty())
      bad(source, "every stage needs a non-empty 'name'");
    const std::string name = s["name"].template get<std::string>();
    const double seconds = number(s, "seconds", source + " stage " + name, true);
    if (seconds < 0) bad(source, "stage " + name + " has a negative duration");
    const double bytes = number(s, "bytes", source, false);
    if (bytes < 0) bad(source, "stage " + name + " has negative bytes");
    const auto b = static_cast<std::uint64_t>(bytes);
    if (s.contains("start") && !s["start"].is_null()) {
      const double start = number(s, "start", source + " stage " + name, true);
      if (start < 0) bad(source, "stage " + name + " starts before the timeline");
      t.add(name, at(start), at(start + seconds), b);
    } else {
      t.add_measured(name, seconds, b);  // no offset given: after the previous stages
    }
  }
  return t;
}

}  // namespace

Timeline timeline_from_json(const nlohmann::json& j, const std::string& source) {
  return read_timeline(j, source);
}

Timeline timeline_from_json(const nlohmann::ordered_json& j, const std::string& source) {
  return read_timeline(j, source);
}

}  // namespace gpuckpt
