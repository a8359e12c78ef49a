// Filesystem helpers for crash-safe output: temporary names, fsync, rename.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace gpuckpt {

// fsync()s a directory so that entries created/renamed in it are durable.
void fsync_dir(const std::filesystem::path& dir);

// Writes `data` to `path` atomically: PATH.tmp-XXXXXX, write, fsync, rename, fsync parent.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);

// Reads a whole (small) file; throws Error(kInvalidInput) if missing.
std::string read_file(const std::filesystem::path& path);

// A unique, not yet existing sibling of `final_path` (".NAME.tmp-<random>"), for building an
// output in place and renaming it at the end. Dot-prefixed so listings and globs skip it.
std::filesystem::path temp_sibling(const std::filesystem::path& final_path);

// Directory that is removed (recursively) on destruction unless release()d.
class TempDir {
 public:
  TempDir() = default;
  // Creates a fresh directory under `parent` named PREFIX-XXXXXX.
  TempDir(const std::filesystem::path& parent, std::string_view prefix);
  // Takes ownership of `path` (which must not exist yet) and creates it.
  static TempDir at(const std::filesystem::path& path);
  TempDir(TempDir&& o) noexcept;
  TempDir& operator=(TempDir&& o) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path release();  // keep the directory; the caller owns it now

 private:
  std::filesystem::path path_;
};

// Bytes allocated to regular files under `dir` (recursive; st_blocks, so tmpfs pages in use).
std::uint64_t allocated_bytes(const std::filesystem::path& dir);

// Sum of regular-file sizes under `dir` (recursive).
std::uint64_t tree_bytes(const std::filesystem::path& dir);

}  // namespace gpuckpt
