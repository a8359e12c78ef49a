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
// exactly `size` bytes, then {"end":true}. Names are single path components. The seal and the
// manifest come first (the checkpoint is complete before it is sent), so the receiver knows
// every chunk at once and can restore while the blobs arrive; a chunk is read only once its
// bytes are in, and a stream cut short fails whatever waits for the rest.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpuckpt/progress.h"
#include "image/arrival.h"

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
// Receives one stream from `fd` into the existing, empty directory `dir` (files 0600), and no
// byte past its end marker.
class StreamReceiver {
 public:
  // Reads the seal and the manifest, checks them (load_manifest) and creates every blob the
  // manifest lists at its full size. Error(kIo) on a stream cut short, Error(kCorrupt) on a
  // malformed one.
  StreamReceiver(int fd, const std::filesystem::path& dir);
  ~StreamReceiver();  // waits for the thread
  StreamReceiver(const StreamReceiver&) = delete;
  StreamReceiver& operator=(const StreamReceiver&) = delete;
  // Receives the blobs on a thread of its own, advancing arrival() as their bytes come in.
  void start();
  const image::BlobArrival& arrival() const { return *arrival_; }
  // Waits for the end marker; returns the payload bytes received. Rethrows the thread's error.
  std::uint64_t join();

 private:
  void receive_blobs();
  int fd_;
  std::filesystem::path dir_;
  std::vector<std::pair<std::string, std::uint64_t>> blobs_;  // name, size, manifest order
  std::unique_ptr<image::BlobArrival> arrival_;
  std::string pending_;  // the first blob's header, read while looking for the manifest
  std::uint64_t received_ = 0;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace gpuckpt::remote
