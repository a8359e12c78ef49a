// The guard's journal: every command a guarded operation gives its guard, kept in a file too,
// for the one death the guard cannot cover: its own together with gpuckpt's (a cgroup's
// SIGKILL, the OOM killer taking both, `kill -9` of both). Without it, a migration killed so
// left its original stopped, its socket entry moved aside, and an unconfirmed copy serving,
// and nothing ever repaired that. The next guarded operation on the host, or `gpuckpt
// recover`, finds the journal and undoes what the guard would have (docs/PROCESS.md, "Faults").
//
// A journal is held (flock, shared) by its gpuckpt and by its guard for as long as either
// lives; the kernel drops a lock with its process however it ends, so a journal nobody holds
// is abandoned. It lives in tmpfs (/run/gpuckpt), and names the boot and the pid namespace
// whose pids and start ticks it records.
#pragma once

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "util/unique_fd.h"

namespace gpuckpt::process {

// gpuckpt's run directory, created if missing: $GPUCKPT_RUN_DIR, else /run/gpuckpt for root,
// else $XDG_RUNTIME_DIR/gpuckpt; it must be a directory of this user's alone (mode 0700): a
// journal or a lock anyone could write would have root kill and rename what it names, or hold
// off its dumps. nullopt, with why, if there is no such directory.
std::optional<std::filesystem::path> run_directory(std::string& why);

class Journal {
 public:
  Journal() = default;
  // A new journal for `operation` ("dump", "migrate"), held, with its header, in the run
  // directory (run_directory). It appears whole: built unnamed (O_TMPFILE), locked, then
  // linked. Without one (no such directory, a full tmpfs) the journal is inactive, the
  // operation goes on (guarded as before) and a warning says what is not covered.
  static Journal open_new(const std::string& operation);
  ~Journal() { remove(); }
  Journal(Journal&&) noexcept = default;
  Journal& operator=(Journal&& o) noexcept {
    if (this != &o) {
      remove();
      path_ = std::move(o.path_);
      fd_ = std::move(o.fd_);
    }
    return *this;
  }
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  bool active() const { return static_cast<bool>(fd_); }
  const std::filesystem::path& path() const { return path_; }
  // One command, as one line (a single write: a gpuckpt killed mid-line leaves a line the
  // reader skips). A write that fails removes the journal, with a warning: one that lacked a
  // later commit would undo that commit.
  void append(const nlohmann::json& command);
  // The operation is over (finished as planned, or recovered): the journal goes.
  void remove() noexcept;
  // Left to the guard, which holds it and removes it once it has recovered.
  void leave() noexcept {
    fd_.reset();
    path_.clear();
  }

 private:
  std::filesystem::path path_;
  UniqueFd fd_;
};

// For the guard: holds the journal at `path` (shared) for as long as the fd is open, so that no
// other run recovers what this guard is recovering. An invalid fd if it cannot be opened.
UniqueFd hold_journal(const std::filesystem::path& path);

struct AbandonedJournal {
  std::filesystem::path path;
  nlohmann::json header;  // operation, pid (gpuckpt's), started (UTC)
  std::vector<nlohmann::json> commands;
};
// Calls `fn` for each journal in the journal directory that nobody holds, written in this boot
// and this pid namespace, while holding it exclusively, and removes it afterwards. One of an
// earlier boot is removed unread (its processes are gone, and its pids name others now); one of
// another pid namespace is left to a gpuckpt of that namespace. Never throws; what it cannot
// read is logged.
void for_each_abandoned_journal(const std::function<void(const AbandonedJournal&)>& fn);

}  // namespace gpuckpt::process
