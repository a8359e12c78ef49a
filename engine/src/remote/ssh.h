// Moving a checkpoint to another host over one SSH connection (OpenSSH's ssh client: no
// authentication or cryptography of our own). The controller runs
//
//   ssh [-F CONFIG] [-p PORT] [USER@]HOST REMOTE_GPUCKPT --json restore - --await-commit ...
//
// and writes the checkpoint to its stdin as a stream of files (below); the remote gpuckpt
// restores it, prints its result as one JSON line, and keeps the copy only when the controller
// then sends "commit" (a dropped connection kills the copy instead).
//
// Stream: the line "GPUCKPT-STREAM 1", then per file a JSON line {"name","size","mode"} and
// exactly `size` bytes, then {"end":true}. Names are single path components; blobs and the
// seal come first and the manifest last, and a receiver keeps nothing unless the end marker
// arrives (the checkpoint's own checksums verify every byte on restore).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "gpuckpt/progress.h"

namespace gpuckpt::remote {

struct SshTarget {
  std::string user, host;
  int port = 0;             // 0: ssh's default (or the config's)
  std::string str() const;  // "ssh://[user@]host[:port]"
};

bool is_ssh_url(std::string_view s);
// ssh://[USER@]HOST[:PORT]; Error(kUsage) otherwise.
SshTarget parse_ssh_url(std::string_view s);

// ssh's argv up to and including the destination; the remote command follows. BatchMode: a
// script never waits on a password prompt; keepalives end a dead connection within ~15 s.
std::vector<std::string> ssh_command(const SshTarget& t, const std::filesystem::path& config);

// Writes every regular file of the checkpoint directory `dir` to `fd` as the stream above.
// Returns the bytes written. Error(kIo) when the other side goes away.
std::uint64_t send_checkpoint(const std::filesystem::path& dir, int fd,
                              const ProgressFn& progress = {});
// Reads one stream from `fd` into the existing, empty directory `dir` (files 0600), and no
// byte past its end marker. Error(kIo) on a stream cut short, Error(kCorrupt) on a malformed
// one. Returns the payload bytes.
std::uint64_t receive_checkpoint(int fd, const std::filesystem::path& dir);

}  // namespace gpuckpt::remote
