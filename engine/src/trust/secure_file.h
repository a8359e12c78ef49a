// Reading files that someone else may have placed: regular files only, never a FIFO that
// blocks, a device, or a symlink to one; bounded in size. And whether a file's owner and mode
// let anyone but root (or us) change it, in the spirit of sshd's StrictModes.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "gpuckpt/error.h"

namespace gpuckpt::trust {

struct ReadLimits {
  std::uint64_t max_bytes = 1 << 20;
  Errc errc = Errc::kInvalidInput;  // for a file of the wrong kind or size
  bool follow_symlink = false;      // false: a symlink is refused (O_NOFOLLOW)
};

// Reads `path` whole. nullopt if it does not exist. Error(limits.errc) if it is a symlink
// (unless followed), not a regular file or larger than max_bytes; Error(kIo) if reading fails.
// `what` names the file in messages ("checkpoint /c: manifest.json"). `st` receives its
// fstat() when given.
std::optional<std::string> read_regular_file(const std::filesystem::path& path,
                                             const std::string& what, const ReadLimits& limits,
                                             struct stat* st = nullptr);

// Empty if `st` is owned by root or the effective uid and writable only by its owner (with
// `sticky_ok`, a directory writable by others is accepted when it has the sticky bit: then
// only an entry's owner may rename or remove it); else why not, e.g. "is owned by uid 1000".
std::string untrusted_because(const struct stat& st, bool sticky_ok = false);

struct Untrusted {
  std::filesystem::path path;
  std::string why;
};
// Checks `path` itself (without sticky_ok) and every directory above it, both along the path
// as given and along its resolved location (a symlink's directory decides where it points).
std::optional<Untrusted> untrusted_path(const std::filesystem::path& path);

}  // namespace gpuckpt::trust
