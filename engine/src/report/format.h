// Number formatting shared by the table and the chart: one spelling of every value, so that a
// number in the chart can be found in the table (and in tests). Locale-independent.
#pragma once

#include <string>
#include <string_view>

namespace gpuckpt::report {

std::string fmt_gbps(double gbps);      // "4315 GB/s", "25.3 GB/s", "0.84 GB/s"
std::string fmt_gflops(double gflops);  // "59000 GFLOP/s", "210 GFLOP/s", "12.6 GFLOP/s"
std::string fmt_intensity(double fpb);  // "8.33 FLOP/B", "0.083 FLOP/B", "128 FLOP/B"
std::string fmt_ratio(double x);        // "6.7x", "120x", "1.05x"
// Three significant digits, no exponent for the ranges a report meets ("0.083", "12.6", "4315").
std::string fmt_sig3(double v);
// "restore is 6.70x faster than cold start" (or "... slower ..." when it is).
std::string speedup_sentence(double speedup);
std::string xml_escape(std::string_view s);

}  // namespace gpuckpt::report
