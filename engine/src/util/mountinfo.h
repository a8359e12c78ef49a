// The mount table of a process (/proc/PID/mountinfo), read into data: one parser for the
// container dump's mounts, the rootfs checks and the cgroup mounts that the freezer reads.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuckpt {

struct MountInfo {
  int id = 0;  // the mount's ID, which /proc/PID/fdinfo names as mnt_id
  std::string mount_point, fstype, options;  // options: the file system's own (super options)
  std::string root;  // the path in its file system that it shows ("/" for a whole one)
  std::string dev;   // its file system's device, MAJOR:MINOR
};

// The mounts listed in `file` (/proc/PID/mountinfo) as that process sees them: mount points
// relative to its root. The mount point and root come back unescaped (the kernel writes a
// space, tab, newline or backslash in them as \ooo); the options as written. Empty if `file`
// cannot be read (the process has ended).
std::vector<MountInfo> read_mountinfo(const std::filesystem::path& file);

// Whether `path` is `root` or under it, in one file system ("/" holds every path).
bool at_or_under(std::string_view path, std::string_view root);

// Where `path`, a path in a file system, shows through a mount of it at `point` that shows the
// file system's `root`; nullopt if `path` is not at or under `root`.
std::optional<std::filesystem::path> shown_at(const std::filesystem::path& point,
                                              std::string_view root, std::string_view path);

// The device number of a MountInfo's `dev` (MAJOR:MINOR), as stat's st_dev gives it for a file
// on that mount; nullopt if it is no such pair.
std::optional<dev_t> device_number(const std::string& major_minor);

}  // namespace gpuckpt
