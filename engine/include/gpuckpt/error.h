// Errors: the engine throws gpuckpt::Error; the CLI catches it at one boundary (main) and maps
// its code to the exit status. Internal code never prints errors itself.
#pragma once

#include <cerrno>
#include <concepts>
#include <filesystem>
#include <optional>
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

// The code's name in --json ("io", "exists"); "unknown" for a value that is no code.
std::string_view errc_name(Errc c) noexcept;
// The code of a name errc_name gives; nullopt for any other word.
std::optional<Errc> errc_from_name(std::string_view name) noexcept;

// An error with its exit code. Context added on the way up (with_context) keeps the code and
// the message it was first thrown with (cause()), so callers never re-parse what() or guess
// the code of a foreign exception.
class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& what) : std::runtime_error(what), code_(code), cause_(what) {}
  Errc code() const noexcept { return code_; }
  // The message as first thrown, before any context was added.
  const std::string& cause() const noexcept { return cause_; }
  // The same error (code and cause) with `before` put in front of the message and `after`
  // behind it, verbatim: "migration failed: " + what() + "\nrollback: ...".
  Error with_context(std::string_view before, std::string_view after = {}) const;

 private:
  Errc code_;
  std::string cause_;
};

// Inside a catch block: rethrows the exception being handled as an Error with context. An
// Error keeps its code; any other exception becomes Errc::kInternal with its what().
[[noreturn]] void rethrow_with_context(std::string_view before, std::string_view after = {});

namespace detail {
inline void append_part(std::string& s, std::string_view v) {
  s += v;
}
template <class T>
requires std::same_as<T, std::filesystem::path>  // not a conversion target: no ambiguity
void append_part(std::string& s, const T& p) {
  s += p.native();
}
template <std::integral T>
void append_part(std::string& s, T v) {
  s += std::to_string(v);
}
template <class... Parts>
std::string join_parts(const Parts&... parts) {
  std::string s;
  (append_part(s, parts), ...);
  return s;
}
std::string with_strerror(std::string what, int err);
}  // namespace detail

// For failed syscalls: throws Error(code, "<parts...>: <strerror(errno)>"). errno is read on
// entry, before the message is built from `parts` (strings, paths, integers), so that
// building it (allocation, path formatting) cannot clobber it: pass the parts, not a
// concatenated string.
template <class... Parts>
[[noreturn]] void throw_errno(Errc code, const Parts&... parts) {
  const int err = errno;
  throw Error(code, detail::with_strerror(detail::join_parts(parts...), err));
}

// As throw_errno, for an error number the call returned (io_uring's -res, a child's errno).
template <class... Parts>
[[noreturn]] void throw_syserr(Errc code, int err, const Parts&... parts) {
  throw Error(code, detail::with_strerror(detail::join_parts(parts...), err));
}

}  // namespace gpuckpt
