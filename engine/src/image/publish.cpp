#include "image/publish.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>

#include "gpuckpt/error.h"
#include "gpuckpt/names.h"
#include "image/manifest.h"
#include "util/fault.h"

namespace fs = std::filesystem;

namespace gpuckpt::image {

namespace {

int rename2(const fs::path& from, const fs::path& to, unsigned flags) {
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags);
}

[[noreturn]] void exists_error(const fs::path& p) {
  throw Error(Errc::kExists,
              "output " + p.string() + " already exists (use --force to replace it)");
}

// A checkpoint directory that is no longer published (moved aside to be removed): without its
// seal it is no checkpoint, and marked it is a temporary that a sweep may take if gpuckpt dies
// before removing it.
void retire(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / kSealName, ec);
  try {
    TempDir::mark(dir);
  } catch (const Error&) {
    // Only a sweep needs it: the removal that follows goes on.
  }
}

}  // namespace

bool is_empty_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::is_empty(p, ec) && !ec;
}

void publish(TempDir& tmp, const fs::path& final_path, bool replace) {
  const fs::path parent =
      final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(final_path, ec));
  if (exists && !replace) exists_error(final_path);
  // Published, it is no temporary: no sweep may take it, whatever its name.
  tmp.unmark();
  fsync_dir(tmp.path());
  if (!exists) {
    if (rename2(tmp.path(), final_path, RENAME_NOREPLACE) == 0) {
      tmp.release();
    } else if (errno == EEXIST || errno == ENOTEMPTY) {
      exists_error(final_path);  // appeared meanwhile
    } else if (errno == EINVAL) {
      // No RENAME_NOREPLACE on this filesystem: plain rename (it cannot replace a non-empty
      // directory; an empty one that appeared meanwhile is an acceptable loss).
      if (::rename(tmp.path().c_str(), final_path.c_str()) != 0)
        throw_errno(Errc::kIo, "rename ", tmp.path(), " to ", final_path);
      tmp.release();
    } else {
      throw_errno(Errc::kIo, "rename ", tmp.path(), " to ", final_path);
    }
    fsync_dir(parent);
    return;
  }
  // Only a directory is ever replaced (an earlier output); a file or a symlink's target is
  // not ours to delete. Callers check this too, with better messages.
  if (!fs::is_directory(fs::symlink_status(final_path, ec)))
    throw Error(Errc::kExists, "output " + final_path.string() +
                                   " exists and is not a directory; refusing to replace it");
  // Replace: swap the two names in one step, then delete the old content (now at tmp).
  if (rename2(tmp.path(), final_path, RENAME_EXCHANGE) == 0) {
    retire(tmp.path());  // before the names are durable: never a sealed copy beside the output
    fsync_dir(parent);
    fault_point(fault::kReplaced);  // the new one published; the old one not yet removed
    return;                         // tmp's destructor removes the old content
  }
  if (errno != EINVAL) throw_errno(Errc::kIo, "replace ", final_path, " with ", tmp.path());
  // No RENAME_EXCHANGE: move the old one aside first. A crash between the two renames
  // leaves the old content under a hidden name beside the output (.NAME.old-*, which no sweep
  // removes: it may be the only copy), never a partial output.
  // Not a TempDir: an interrupt's cleanup must never take it while it is the only copy.
  const fs::path old = temp_sibling(final_path, "old");
  if (::rename(final_path.c_str(), old.c_str()) != 0)
    throw_errno(Errc::kIo, "move ", final_path, " aside");
  if (::rename(tmp.path().c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::rename(old.c_str(), final_path.c_str());  // best effort: put the old one back
    throw_syserr(Errc::kIo, err, "rename ", tmp.path(), " to ", final_path);
  }
  tmp.release();
  fsync_dir(parent);
  fs::remove_all(old, ec);
}

void unpublish(const fs::path& published) {
  const fs::path aside = temp_sibling(published, "tmp");
  // No RENAME_NOREPLACE on this filesystem: a plain rename, to a name nobody else picks.
  if (rename2(published, aside, RENAME_NOREPLACE) != 0 &&
      (errno != EINVAL || ::rename(published.c_str(), aside.c_str()) != 0))
    throw_errno(Errc::kIo, "move ", published, " aside to remove it");
  const fs::path parent = published.parent_path().empty() ? fs::path(".") : published.parent_path();
  fsync_dir(parent);
  retire(aside);
  fault_point(fault::kUnpublished);  // no longer a checkpoint; not yet removed
  std::error_code ec;
  fs::remove_all(aside, ec);
  if (ec) throw Error(Errc::kIo, "cannot remove " + aside.string() + ": " + ec.message());
}

}  // namespace gpuckpt::image
