// The lines that a migration's two gpuckpts exchange over ssh, both sides in one place: the
// controller (`migrate --to ssh://HOST`, engine/src/process/migrate_ssh.cpp) writes the stream to
// the target's stdin and reads its stdout; the target (`restore - --await-commit`,
// cli/cmd_process.cpp) answers. docs/PROCESS.md, "Migration over ssh".
//
//   target -> controller   {"receiving": true, "devices": [...]}: its spool is ready and it reads
//                          the stream. Anything else is a failure, before the controller freezes.
//   controller -> target   the checkpoint stream, then nothing until the result.
//   target -> controller   the restore's result as one JSON line (`restore --json`'s document,
//                          "ok": true), or gpuckpt --json's error ("ok": false, "error": {"code",
//                          "message"}).
//   controller -> target   "commit\n": the copy stays. End of input, or any other line, and the
//                          target kills its copy.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "gpuckpt/error.h"

namespace gpuckpt::migrate_wire {

// The controller's commit, as it goes down the target's stdin.
inline constexpr std::string_view kCommitLine = "commit\n";

// The target's first line, with its GPUs (`gpuckpt --json devices`' list): the controller checks
// them before it freezes anything.
nlohmann::json receiving(nlohmann::json devices);
// Whether the target's line `j` is that one.
bool is_receiving(const nlohmann::json& j);

// Writes `j` as one line to `fd` (the target's stdout). Throws Error(kIo).
void send_line(int fd, const nlohmann::json& j);
// Writes kCommitLine to `fd` (the target's stdin). Throws Error(kIo) naming `where`.
void send_commit(int fd, const std::string& where);
// The target: reads one line (at most 64 bytes) from `fd`, blocking; whether it is the commit.
bool read_commit(int fd);

// The failure that the target's line `j` reports, if it reports one: its error code (kInternal
// for a word no code has, which is the target's bug) and message ("" for `j` of another shape).
struct TargetFailure {
  Errc code = Errc::kInternal;
  std::string message;
};
std::optional<TargetFailure> failure_of(const nlohmann::json& j);

}  // namespace gpuckpt::migrate_wire
