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

// Removes a published checkpoint (or unpacked tree) so that no interruption leaves it looking
// whole: it is first renamed aside under a temporary's name (.NAME.tmp-*), its seal removed and
// the directory marked as a temporary, and only then deleted; a run killed meanwhile leaves a
// temporary that the next output beside it sweeps. Throws Error(kIo) when it cannot be moved
// aside (it is then left whole where it was).
void unpublish(const std::filesystem::path& published);

// True if `p` exists and is a directory with no entries.
bool is_empty_dir(const std::filesystem::path& p);

}  // namespace gpuckpt::image
