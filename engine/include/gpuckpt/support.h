// Small jobs the CLI shares with the engine, so that each has one implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/unique_fd.h"

namespace gpuckpt {

std::string format_seconds(double s);         // "12.40 s", "85.3 ms", "420 us"
std::string format_mode(std::uint32_t mode);  // permission bits as "0644"
std::string format_hex64(std::uint64_t v);    // 16 lower-case hex digits
// "64M", "1.5G", "4096", "256K" -> bytes; throws Error(kUsage) "bad size: ..." otherwise.
std::uint64_t parse_bytes(const std::string& s);
// Runs `command` with /bin/sh -c (stdin from /dev/null); its exit code, or -1 if it was killed
// or could not run.
int run_shell(const std::string& command);
// `s` as one word for /bin/sh: in single quotes, with embedded ones escaped.
std::string shell_quote(std::string_view s);
// This machine's host name (gethostname), "" if it has none.
std::string host_name();
// MemAvailable from /proc/meminfo in bytes (0 if unknown).
std::uint64_t mem_available_bytes();
// This boot's id (/proc/sys/kernel/random/boot_id), "" if unknown: pids are this boot's only.
std::string boot_id();
// The CPUs this process may run on (its affinity mask, which a cpuset container narrows): their
// ids in order, and how many (at least 1). Not std::thread::hardware_concurrency(): that counts
// every CPU of the host.
std::vector<int> usable_cpu_ids();
unsigned usable_cpus();

// Test hook: deterministic places to interrupt gpuckpt. When $GPUCKPT_FAULT_PAUSE names a point
// that gpuckpt reaches, it creates the file $GPUCKPT_FAULT_MARK and then blocks there forever,
// so that a test can send its signal (or SIGKILL) at exactly that phase; with
// $GPUCKPT_FAULT_RESUME=unmark it goes on once the mark is removed, so that a test can look at
// that phase. Unset, a fault point costs one getenv. docs/PROCESS.md ("Faults") lists the points.
void fault_point(std::string_view name);
// Whether a test holds gpuckpt at `name`: for a point whose placing costs something (a hook
// inside an HTTP transfer), which gpuckpt then sets up only for that test.
bool fault_point_armed(std::string_view name);

}  // namespace gpuckpt
