// What pack reads: the entries under an input directory (or one input file), in a stable
// order (byte-wise sorted, parents before children) so that checkpoints are reproducible.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "image/manifest.h"

namespace gpuckpt::image {

struct InputEntry {
  std::string rel;  // '/'-separated, relative to the root
  EntryType type = EntryType::kFile;
  std::uint32_t mode = 0;
  std::uint64_t size = 0;
  std::string target;  // symlinks
  std::filesystem::path abs;
};

struct InputTree {
  bool single_file = false;
  std::filesystem::path root;  // the directory, or the single file itself
  std::vector<InputEntry> entries;
};

// Throws Error(kInvalidInput) if `input` is missing or holds something that cannot be packed
// (devices, sockets, FIFOs).
InputTree scan_input(const std::filesystem::path& input);

}  // namespace gpuckpt::image
