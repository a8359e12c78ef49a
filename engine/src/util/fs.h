// Filesystem helpers for crash-safe output: temporary names, fsync, rename.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/unique_fd.h"

namespace gpuckpt {

// fsync()s a directory so that entries created/renamed in it are durable.
void fsync_dir(const std::filesystem::path& dir);

// Writes `data` to `path` atomically: PATH.tmp-XXXXXX, write, fsync, rename, fsync parent.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);

// Reads a whole (small) file; throws Error(kInvalidInput) if missing.
std::string read_file(const std::filesystem::path& path);
// Reads `fd` from its offset to its end (a file already opened and checked); `name` is for the
// error (Error(kIo)).
std::string read_rest(int fd, const std::filesystem::path& name);

// A unique, not yet existing sibling of `final_path` (".NAME.TAG-<random>"), for building an
// output in place and renaming it at the end. Dot-prefixed so listings and globs skip it.
std::filesystem::path temp_sibling(const std::filesystem::path& final_path,
                                   std::string_view tag = "tmp");

// The file by which a directory says it is a gpuckpt temporary (TempDir writes it first thing,
// publish() removes it before the rename): remove_abandoned takes nothing without it, so a
// user's directory or a published checkpoint named like ours is never swept.
inline constexpr const char* kTempMarker = ".gpuckpt-temp";

// Directory that is removed (recursively) on destruction unless release()d.
//
// While it lives it holds an flock on itself. That is how a later run tells a directory in use
// from one abandoned by a gpuckpt killed together with its guard, or by a host that went down
// (remove_abandoned): the kernel drops the lock with the process, however it ends.
class TempDir {
 public:
  TempDir() = default;
  // Creates a fresh directory under `parent` named PREFIX-XXXXXX.
  TempDir(const std::filesystem::path& parent, std::string_view prefix);
  // Takes ownership of `path` (which must not exist yet) and creates it.
  static TempDir at(const std::filesystem::path& path);
  // A fresh temporary sibling of `final_path` (temp_sibling's name), mode 0700, to build an
  // output in and publish by rename. First removes the siblings that killed runs abandoned.
  // `before_create` is given the path before the directory exists, so that a guard can
  // promise to remove it whenever this process dies.
  static TempDir beside(
      const std::filesystem::path& final_path,
      const std::function<void(const std::filesystem::path&)>& before_create = {});
  TempDir(TempDir&& o) noexcept;
  TempDir& operator=(TempDir&& o) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path release();  // keep the directory; the caller owns it now
  // Removes the marker (kTempMarker), before the directory is published under its final name.
  void unmark() const;
  // Marks an existing directory as a temporary of this gpuckpt (kTempMarker), so that a sweep
  // may take it once nobody holds it.
  static void mark(const std::filesystem::path& dir);

 private:
  void take(std::filesystem::path path);  // locks `path`, just created, and registers it
  void forget() noexcept;                 // unregisters (an interrupt no longer removes it)
  void drop() noexcept;                   // unregisters, removes, unlocks

  std::filesystem::path path_;
  UniqueFd lock_;
};

// Removes the directories directly in `parent` that are named as our temporaries are (one of
// `prefixes`, then the 6 or 16 random characters of mkdtemp or temp_sibling), that hold our
// marker (kTempMarker), that are not a published checkpoint (a manifest and its seal) and that
// nobody holds (a live TempDir, or hold_dir). Returns each with the bytes it held. Symlinks, plain
// files and other names are left alone, and so is a network filesystem, where a lock does not
// tell another host's use. Never throws: each removal and each failure is logged.
struct RemovedDir {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
};
std::vector<RemovedDir> remove_abandoned(const std::filesystem::path& parent,
                                         const std::vector<std::string>& prefixes) noexcept;

// Keeps `path` (a TempDir's, maybe another process's) from remove_abandoned for as long as the
// returned fd is open: for a guard that still needs a directory after its gpuckpt died.
UniqueFd hold_dir(const std::filesystem::path& path);

// Another process removes `path` now (a guard, on recovery): remove_live_temp_dirs leaves it to
// it, since the guard may still need it then. take_back_temp_dir undoes this.
void hand_over_temp_dir(const std::filesystem::path& path);
void take_back_temp_dir(const std::filesystem::path& path);
// From now on a TempDir that was handed over is left to its guard when dropped, too: after an
// interrupt the guards recover while the operation's thread unwinds, and that unwinding must
// not remove what a recovery still reads (criu's pidfile in a restore's staging).
void leave_handed_over_temp_dirs();

// For an interrupt, whose program exits next: removes the directory of every TempDir of this
// process that is still alive and was not handed over to a guard. Each is first renamed away, so
// that an operation still running on another thread cannot publish it half removed; what a writer
// adds meanwhile is left under the new name, unlocked once the process is gone, for
// remove_abandoned.
std::vector<RemovedDir> remove_live_temp_dirs();

// Bytes allocated to regular files under `dir` (recursive; st_blocks, so tmpfs pages in use).
std::uint64_t allocated_bytes(const std::filesystem::path& dir);

// Whether `fd` is still the file at `path` (not followed through a link): one that was locked
// may have been removed, and another put there, by whoever held the lock before.
bool still_at(const UniqueFd& fd, const std::filesystem::path& path);

// Sum of regular-file sizes under `dir` (recursive; a symbolic link's target is not under it).
std::uint64_t tree_bytes(const std::filesystem::path& dir);

}  // namespace gpuckpt
