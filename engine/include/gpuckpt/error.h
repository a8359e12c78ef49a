// Errors: the engine throws gpuckpt::Error; the CLI catches it at one boundary (main) and maps
// its code to the exit status. Internal code never prints errors itself.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace gpuckpt {

// Stable exit codes, documented in docs/CLI.md. Scripts depend on them: never renumber.
enum class Errc : int {
  kOk = 0,
  kInternal = 1,      // a bug or an unexpected system error
  kUsage = 2,         // bad command line or option value
  kInvalidInput = 3,  // input file/dir missing or of the wrong kind
  kCorrupt = 4,       // checksum mismatch, truncated blob, unparsable manifest
  kVersion = 5,       // checkpoint format version not supported
  kIo = 6,            // read/write/fsync failed (e.g. disk full)
  kNoDevice = 7,      // no GPU / no CUDA driver / driver lacks the checkpoint API
  kDevice = 8,        // a CUDA driver call failed
  kCriu = 9,          // CRIU missing or failed
  kProcess = 10,      // target process missing, not answering, or not in the expected state
  kTimeout = 11,      // a bounded wait expired (lock timeout, readiness probe)
  kExists = 12,       // output exists and --force was not given
};

std::string_view errc_name(Errc c) noexcept;

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

// Throws Error(code, "<what>: <strerror(err)>"); for failed syscalls.
[[noreturn]] void throw_errno(Errc code, const std::string& what, int err);
[[noreturn]] void throw_errno(Errc code, const std::string& what);  // uses errno

}  // namespace gpuckpt
