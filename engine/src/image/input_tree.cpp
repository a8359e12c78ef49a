#include "image/input_tree.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "gpuckpt/error.h"
#include "util/fs.h"
#include "util/utf8.h"

namespace fs = std::filesystem;

namespace gpuckpt::image {

namespace {

std::vector<std::string> list_dir(const fs::path& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) throw_errno(Errc::kInvalidInput, "open directory ", dir);
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent* de = ::readdir(d.get());
    if (!de) {
      if (errno) throw_errno(Errc::kIo, "read directory ", dir);
      break;
    }
    const std::string_view n = de->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

InputEntry make_entry(const fs::path& abs, std::string rel, bool follow) {
  // The name that marks gpuckpt's temporaries: an unpacked copy holding it would be swept as one.
  if (rel == kTempMarker)
    throw Error(Errc::kInvalidInput, "cannot pack " + abs.string() + ": " + kTempMarker +
                                         " at the top is the name that marks gpuckpt's "
                                         "temporary directories, and an unpacked copy holding "
                                         "it would be removed as one; rename it");
  struct stat st {};
  if ((follow ? ::stat(abs.c_str(), &st) : ::lstat(abs.c_str(), &st)) != 0)
    throw_errno(Errc::kInvalidInput, "stat ", abs);
  // The manifest names every entry in JSON, which holds UTF-8 only: a name that is not would
  // come back as another name.
  if (!is_utf8(rel))
    throw Error(Errc::kInvalidInput, "cannot pack " + abs.string() +
                                         ": its name is not UTF-8, and a checkpoint's manifest "
                                         "(JSON) holds UTF-8 names only; rename it");
  InputEntry e;
  e.rel = std::move(rel);
  e.abs = abs;
  e.mode = st.st_mode & 07777;
  if (S_ISREG(st.st_mode)) {
    e.type = EntryType::kFile;
    e.size = static_cast<std::uint64_t>(st.st_size);
  } else if (S_ISDIR(st.st_mode)) {
    e.type = EntryType::kDir;
  } else if (S_ISLNK(st.st_mode)) {
    e.type = EntryType::kSymlink;
    std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(abs.c_str(), target.data(), target.size());
    if (n < 0) throw_errno(Errc::kInvalidInput, "readlink ", abs);
    target.resize(static_cast<size_t>(n));
    if (!is_utf8(target))
      throw Error(
          Errc::kInvalidInput,
          "cannot pack the symbolic link " + abs.string() +
              ": its target is not UTF-8, which a checkpoint's manifest (JSON) cannot hold");
    e.target = std::move(target);
  } else {
    throw Error(Errc::kInvalidInput,
                "cannot pack " + abs.string() + ": not a regular file, directory or symlink");
  }
  return e;
}

void walk(const fs::path& dir, const std::string& prefix, std::vector<InputEntry>& out) {
  for (const auto& name : list_dir(dir)) {
    const std::string rel = prefix.empty() ? name : prefix + "/" + name;
    InputEntry e = make_entry(dir / name, rel, false);
    const bool is_dir = e.type == EntryType::kDir;
    out.push_back(std::move(e));
    if (is_dir) walk(dir / name, rel, out);
  }
}

}  // namespace

InputTree scan_input(const fs::path& input) {
  struct stat st {};
  if (::stat(input.c_str(), &st) != 0) {
    if (errno == ENOENT)
      throw Error(Errc::kInvalidInput, "input " + input.string() + " does not exist");
    throw_errno(Errc::kInvalidInput, "stat input ", input);
  }
  InputTree t;
  t.root = input;
  if (S_ISDIR(st.st_mode)) {
    walk(input, "", t.entries);
  } else if (S_ISREG(st.st_mode)) {
    t.single_file = true;
    const fs::path abs = fs::absolute(input);
    t.entries.push_back(make_entry(abs, abs.filename().string(), true));
  } else {
    throw Error(Errc::kInvalidInput,
                "input " + input.string() + " is neither a directory nor a regular file");
  }
  return t;
}

}  // namespace gpuckpt::image
