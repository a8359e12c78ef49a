#include "process/journal.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>

#include "gpuckpt/support.h"
#include "image/transfer_common.h"
#include "util/fs.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt::process {

namespace {

constexpr int kJournalFormat = 1;
constexpr std::string_view kTag = "journal";  // temp_sibling's tag: .OPERATION-PID.journal-HEX

// What a journal's pids and start ticks are relative to: this boot (boot_id), this pid
// namespace.
std::string pid_namespace() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/ns/pid", ec).string();
}

// "PATH: strerror(err)", for an errno read before anything else could change it.
std::string failed(const fs::path& path, int err) {
  return path.string() + ": " + std::strerror(err);
}

}  // namespace

std::optional<fs::path> run_directory(std::string& why) {
  fs::path dir;
  if (const char* e = std::getenv("GPUCKPT_RUN_DIR"); e && *e) {
    dir = e;
  } else if (::geteuid() == 0) {
    dir = "/run/gpuckpt";
  } else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) {
    dir = fs::path(x) / "gpuckpt";
  } else {
    why = "no $XDG_RUNTIME_DIR for a user other than root";
    return std::nullopt;
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    why = "cannot create " + failed(dir, errno);
    return std::nullopt;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    why = failed(dir, errno);
    return std::nullopt;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    why = dir.string() + " is not a directory writable by this user alone";
    return std::nullopt;
  }
  return dir;
}

namespace {

// Ours: .NAME.journal- and temp_sibling's 16 hex digits.
bool journal_name(const std::string& name) {
  const std::string mid = "." + std::string(kTag) + "-";
  const auto at = name.rfind(mid);
  if (name.empty() || name[0] != '.' || at == std::string::npos) return false;
  const std::string_view hex = std::string_view(name).substr(at + mid.size());
  return hex.size() == 16 && hex.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// 0, or the write's errno.
int write_line(int fd, const json& j) {
  // The paths it names are UTF-8 (require_utf8_path, before anything is frozen); anything else
  // must not stop the operation here.
  const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return write_fully(fd, line.data(), line.size());
}

// Waits while another run recovers the journal open at `fd` (it holds it exclusively), so that
// this run does not act on the same processes meanwhile. A lock shared at once means a live
// gpuckpt or guard holds it instead: nothing to wait for.
void wait_for_a_recovery(int fd, const fs::path& path) {
  if (::flock(fd, LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK) return;
  spdlog::info("waiting for another gpuckpt to finish recovering from {}", path.string());
  while (::flock(fd, LOCK_SH) != 0 && errno == EINTR) {
  }
}

// The journal at `path`, open at `fd` and held exclusively; nullopt, logged, if it is not one
// this gpuckpt reads.
std::optional<AbandonedJournal> read_journal(int fd, const fs::path& path) {
  AbandonedJournal j;
  j.path = path;
  std::istringstream in(read_rest(fd, path));
  std::string line;
  std::getline(in, line);
  j.header = json::parse(line, nullptr, false);
  const auto field = [&](const char* key) {
    return j.header.is_object() && j.header.contains(key) ? j.header[key] : json();
  };
  if (field("gpuckpt_journal") != kJournalFormat || !field("boot_id").is_string() ||
      !field("pidns").is_string() || !field("operation").is_string() ||
      !field("pid").is_number_integer() || !field("started").is_string()) {
    spdlog::warn("{} is not a journal this gpuckpt reads; left as it is", path.string());
    return std::nullopt;
  }
  for (; std::getline(in, line);) {
    json c = json::parse(line, nullptr, false);
    // A line cut short by the kill was written before the guard was told: it acted on it
    // neither.
    if (c.is_object() && c.contains("op")) j.commands.push_back(std::move(c));
  }
  return j;
}

}  // namespace

Journal Journal::open_new(const std::string& operation) {
  Journal j;
  auto not_kept = [&](const std::string& why) {
    spdlog::warn(
        "no journal for this {} ({}): if gpuckpt and its guard are both killed, nothing "
        "undoes it",
        operation, why);
    return Journal();
  };
  std::string why;
  const auto dir = run_directory(why);
  if (!dir) return not_kept(why);
  UniqueFd fd(::open(dir->c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!fd) return not_kept("O_TMPFILE in " + failed(*dir, errno));
  // Locked before it has a name: no run ever finds it unheld while its gpuckpt lives.
  if (::flock(fd.get(), LOCK_SH) != 0) return not_kept("flock in " + failed(*dir, errno));
  const json header = {
      {"gpuckpt_journal", kJournalFormat},   {"operation", operation}, {"pid", ::getpid()},
      {"started", image::utc_now_iso8601()}, {"boot_id", boot_id()},   {"pidns", pid_namespace()}};
  if (const int err = write_line(fd.get(), header))
    return not_kept("write in " + failed(*dir, err));
  const std::string self = "/proc/self/fd/" + std::to_string(fd.get());
  for (int attempt = 0; attempt < 10; ++attempt) {
    const fs::path p = temp_sibling(*dir / (operation + "-" + std::to_string(::getpid())), kTag);
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, p.c_str(), AT_SYMLINK_FOLLOW) == 0) {
      j.path_ = p;
      j.fd_ = std::move(fd);
      return j;
    }
    if (const int err = errno; err != EEXIST || attempt == 9)
      return not_kept("cannot name it: " + failed(p, err));
  }
  return j;
}

void Journal::append(const json& command) {
  if (!fd_) return;
  const int err = write_line(fd_.get(), command);
  if (err == 0) return;
  remove();
  spdlog::warn(
      "the journal of this operation could not be written ({}), so it was removed: if gpuckpt "
      "and its guard are both killed now, nothing undoes the operation",
      std::strerror(err));
}

void Journal::remove() noexcept {
  if (!fd_) return;
  ::unlink(path_.c_str());
  fd_.reset();
  path_.clear();
}

UniqueFd hold_journal(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd && ::flock(fd.get(), LOCK_SH) != 0) fd.reset();
  return fd;
}

void for_each_abandoned_journal(const std::function<void(const AbandonedJournal&)>& fn) {
  std::string why;
  const auto dir = run_directory(why);
  if (!dir) {
    spdlog::debug("no journals to look at: {}", why);
    return;
  }
  const std::string boot = boot_id(), pidns = pid_namespace();
  std::error_code ec;
  for (auto it = fs::directory_iterator(*dir, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const fs::path p = it->path();
    if (!journal_name(p.filename().string())) continue;
    try {
      UniqueFd fd(::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      struct stat st {};
      if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
        continue;
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        wait_for_a_recovery(fd.get(), p);
        continue;  // its gpuckpt or guard lives, or another run has recovered it
      }
      // Removed by its owner (or by another run's recovery) between our open and our lock.
      if (::fstat(fd.get(), &st) != 0 || st.st_nlink == 0) continue;
      const auto j = read_journal(fd.get(), p);
      if (!j) continue;
      if (j->header["boot_id"] != boot) {
        spdlog::info("removed {}: its gpuckpt ran before the last boot", p.string());
      } else if (j->header["pidns"] != pidns) {
        continue;  // for a gpuckpt of that pid namespace, whose pids it names
      } else {
        fn(*j);
      }
      ::unlink(p.c_str());
    } catch (const std::exception& e) {
      // Kept: a later run tries again (what was undone bears repeating).
      spdlog::warn("recovering from the journal {}: {}", p.string(), e.what());
    }
  }
}

}  // namespace gpuckpt::process
