// State shared by all subcommands: output mode, progress drawing, JSON emission.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "gpuckpt/gpuckpt.h"
#include "gpuckpt/report.h"
#include "gpuckpt/roofline.h"
#include "gpuckpt/support.h"

namespace gpuckpt::cli {

struct Context {
  bool json = false;   // machine-readable output on stdout, nothing else there
  bool quiet = false;  // no progress
  std::string log_level = "info";
  // Exit status for a command that reports a failure through its own output (e.g. `devices`
  // with no GPU prints its JSON document and exits 7); main() returns it.
  int exit_code = 0;

  // A progress sink that draws "phase  1.2 GiB / 4.0 GiB  2.3 GB/s" on stderr when it is a
  // TTY (and not --quiet); otherwise a no-op.
  ProgressFn progress() const;
  // Ends a progress line, if one was drawn.
  void progress_done() const;
  // Prints `j` as one JSON document on stdout; `emit_ordered`, in its members' order (the
  // engine's documents: reports, roofline, bench).
  void emit(const nlohmann::json& j) const;
  void emit_ordered(const nlohmann::ordered_json& j) const;
};

// `j` as text (`indent` as nlohmann's dump). Bytes that are not UTF-8 (a path, a process's
// name) come out as U+FFFD instead of throwing: the JSON must come out.
std::string json_text(const nlohmann::json& j, int indent = -1);
std::string json_text(const nlohmann::ordered_json& j, int indent = -1);

std::string human_bytes(std::uint64_t b);
// Prints a per-stage table (name, seconds, bytes, GB/s) to stdout.
void print_stages(const Timeline& t);
// A checkpoint's signature state, for `inspect` and `verify`: JSON and one line of text.
nlohmann::json signature_json(const SignatureInfo& s);
std::string signature_text(const SignatureInfo& s, const std::filesystem::path& trusted_keys);

}  // namespace gpuckpt::cli
