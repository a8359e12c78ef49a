// What the roofline needs to know about this host's CPUs, read from /proc and /sys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpuckpt {

// "model name" from /proc/cpuinfo (x86), else another identifying field, else "unknown CPU".
std::string cpu_model_name();
// Total last-level cache in bytes over all its instances (0 if sysfs does not say).
std::uint64_t last_level_cache_bytes();

}  // namespace gpuckpt
