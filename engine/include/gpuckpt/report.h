// The transient report: cold start, restore and migration wall-clock numbers, per stage,
// beside the roofline ceilings.
#pragma once

#include <optional>
#include <string>

#include "gpuckpt/roofline.h"
#include "gpuckpt/timing.h"

namespace gpuckpt {

struct TransientReport {
  Ceilings ceilings;
  std::optional<RooflinePlacement> workload;
  std::optional<Timeline> cold_start;  // decision -> first token
  std::optional<Timeline> restore;     // interruption -> serving
  std::optional<Timeline> migration;   // decision -> answering elsewhere
};

std::string render_table(const TransientReport& r);
std::string render_json(const TransientReport& r);
std::string render_svg(const TransientReport& r);
std::string render_html(const TransientReport& r);  // self-contained, embeds the SVG

}  // namespace gpuckpt
