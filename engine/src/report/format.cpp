#include "report/format.h"

#include <cmath>
#include <cstdio>

namespace gpuckpt::report {

namespace {
std::string printf_str(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}
}  // namespace

std::string fmt_sig3(double v) {
  const double a = std::fabs(v);
  if (a >= 100) return printf_str("%.0f", v);
  if (a >= 10) return printf_str("%.1f", v);
  if (a >= 1) return printf_str("%.2f", v);
  if (a >= 0.1) return printf_str("%.3f", v);
  if (a >= 0.01) return printf_str("%.4f", v);
  if (a == 0) return "0";
  return printf_str("%.2g", v);
}

std::string fmt_gbps(double gbps) {
  return fmt_sig3(gbps) + " GB/s";
}
std::string fmt_gflops(double gflops) {
  return fmt_sig3(gflops) + " GFLOP/s";
}
std::string fmt_intensity(double fpb) {
  return fmt_sig3(fpb) + " FLOP/B";
}
std::string fmt_ratio(double x) {
  return (x >= 100  ? printf_str("%.0f", x)
          : x >= 10 ? printf_str("%.1f", x)
                    : printf_str("%.2f", x)) +
         "x";
}

std::string speedup_sentence(double speedup) {
  if (speedup >= 1) return "restore is " + fmt_ratio(speedup) + " faster than cold start";
  return "restore is " + fmt_ratio(1 / speedup) + " slower than cold start";
}

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0; they carry no meaning in a label.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
}

}  // namespace gpuckpt::report
