// The last step of every output (pack's checkpoint, unpack's tree): a fully written and
// fsync()ed temporary sibling directory takes the final name in one rename.
#pragma once

#include <filesystem>

#include "util/fs.h"

namespace gpuckpt::image {

// Moves `tmp` to `final_path`, then fsyncs the parent. If `final_path` exists it is replaced
// when `replace` (atomically with RENAME_EXCHANGE where the filesystem supports it; the old
// content is removed afterwards), else Error(kExists). On success `tmp` is released.
void publish(TempDir& tmp, const std::filesystem::path& final_path, bool replace);

// True if `p` exists and is a directory with no entries.
bool is_empty_dir(const std::filesystem::path& p);

}  // namespace gpuckpt::image
