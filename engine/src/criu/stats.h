// CRIU's own stage timings: the `stats-dump` / `stats-restore` images it writes at the end of a
// successful dump/restore. They are small protobuf messages (images/stats.proto); we decode the
// few varint fields we use by hand rather than depend on protobuf or on `crit` (python).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

namespace gpuckpt::criu {

struct DumpStats {
  std::uint32_t freezing_us = 0;  // seizing the tasks (includes the PAUSE_DEVICES hook)
  std::uint32_t frozen_us = 0;    // from "all frozen" to the end of the dump
  std::uint32_t memdump_us = 0;   // draining memory through the parasite
  std::uint32_t memwrite_us = 0;  // writing the page images
  std::uint64_t pages_scanned = 0;
  std::uint64_t pages_written = 0;
};

struct RestoreStats {
  std::uint32_t forking_us = 0;  // recreating the task tree
  std::uint32_t restore_us = 0;  // restoring the tasks' state
  std::uint64_t pages_restored = 0;
};

// A span of a restore that gpuckpt's CRIU patches time in its log: each restored process logs
// when its part starts and, once done, its bytes and seconds; the span runs from the first start
// to the last end, on CRIU's log clock (seconds since criu started).
struct LoggedSpan {
  std::uint64_t bytes = 0;
  double start_s = 0, end_s = 0;
};
struct RestoreLogSpans {
  // The huge-page fill's populate threads (scripts/criu-patches/0002): how fast this restore
  // met its memory.
  std::optional<LoggedSpan> fill;
  // The pages images copied by several streams (scripts/criu-patches/0004).
  std::optional<LoggedSpan> copy;
};

// nullopt if the file is absent; throws Error(kCriu) if it is malformed.
std::optional<DumpStats> read_dump_stats(const std::filesystem::path& images_dir);
std::optional<RestoreStats> read_restore_stats(const std::filesystem::path& images_dir);

// Each nullopt without its lines (not asked for, or CRIU without the patch), a line it cannot
// read, or a log.
RestoreLogSpans read_restore_log_spans(const std::filesystem::path& restore_log);
std::optional<LoggedSpan> parse_fill_stats(std::string_view log);
std::optional<LoggedSpan> parse_copy_stats(std::string_view log);

// Exposed for tests: decode the image bytes (magics + one length-prefixed stats_entry).
DumpStats decode_dump_stats(std::string_view image);
RestoreStats decode_restore_stats(std::string_view image);

}  // namespace gpuckpt::criu
