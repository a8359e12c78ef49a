// Moving a checkpoint to another host over one SSH connection (OpenSSH's ssh client: no
// authentication or cryptography of our own). The controller runs
//
//   ssh [-F CONFIG] [-p PORT] [USER@]HOST REMOTE_GPUCKPT --json restore - --await-commit ...
//
// and writes the checkpoint to its stdin while it is written here: the transfer runs beside the
// dump. The remote gpuckpt first answers one line saying it is receiving (with its GPUs, which
// the controller checks before it freezes anything); it restores as soon as the manifest is
// in, reading each chunk once its bytes have arrived, prints its result as one JSON line, and
// keeps the copy only when the controller then sends "commit" (a dropped connection kills the
// copy instead).
//
// Stream: the line "GPUCKPT-STREAM 2"; then pieces of blobs, each a JSON line
// {"blob","offset","size"} and exactly `size` bytes at `offset` of that blob, every blob
// in order from offset 0 without gaps; somewhere among them, once the dump has published it,
// the seal and then the manifest, each a JSON line {"name","size"} and its bytes; and after
// the last piece, {"end":true}. The manifest cannot come first, as it is written last; CRIU's
// restore could not start before it anyway (it reads inventory.img first, which the dump
// writes last). It does not wait for the pieces still to come, which is what lets the
// target's restore overlap the rest of the transfer.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpuckpt/progress.h"
#include "image/arrival.h"
#include "image/blob_tap.h"
#include "image/event_fd.h"
#include "util/unique_fd.h"

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

// The sending side of one stream into `fd`. A StreamPacker tells it (image::BlobTap) how far
// each blob is written; its own thread sends those bytes from the blob files (sendfile: no
// memory of its own, and the dump never waits for the network), then the manifest as soon as
// it is given, then the rest.
class StreamSender : public image::BlobTap {
 public:
  // Sends on its own duplicate of `fd`: whoever owns `fd` may close it at any time (the
  // connection killed on a failure) without this thread writing into a reused descriptor.
  explicit StreamSender(int fd);
  ~StreamSender() override;  // stops the thread; the stream is left unfinished
  StreamSender(const StreamSender&) = delete;
  StreamSender& operator=(const StreamSender&) = delete;

  // Throw Error(kIo) once sending has failed (the connection is gone): the dump fails early and
  // its guard resumes the process.
  void blob_created(std::uint32_t blob, const std::filesystem::path& path) override;
  void blob_written(std::uint32_t blob, std::uint64_t end) override;
  // The checkpoint is published at `dir`: its seal and manifest go next, then whatever of its
  // blobs is still unsent (all of them after a staged dump, whose packer had no tap). Waits
  // for the end marker to be written; returns the payload bytes sent. Rethrows the thread's
  // error. Error(kTimeout) once the target has taken no byte for `stall`: a target that is
  // alive but reads nothing would otherwise keep a frozen original waiting for good. The
  // thread may then still be blocked in a write: the caller ends the connection (kills ssh)
  // before this object goes.
  std::uint64_t finish(const std::filesystem::path& dir, const ProgressFn& progress = {},
                       std::chrono::seconds stall = std::chrono::seconds(60));
  // Whether sending has failed: the connection broke, or the target stopped reading.
  bool failed() const;
  // When the first byte went out (the transfer's start); valid once anything was sent.
  std::chrono::steady_clock::time_point first_byte() const { return first_; }

 private:
  struct State;
  void run();
  UniqueFd fd_;
  std::unique_ptr<State> st_;
  std::chrono::steady_clock::time_point first_{};
  std::thread thread_;
};

// Receives one stream from `fd` into the existing, empty directory `dir` (files 0600).
class StreamReceiver {
 public:
  // Reads up to and including the manifest, writing the pieces before it; checks the seal and
  // manifest (load_manifest), that every piece so far belongs to a blob it lists, and gives
  // every blob its full size. Error(kIo) on a stream cut short, or one that would leave its
  // filesystem with less than 2% (at most 1 GiB) free; Error(kCorrupt) on a malformed one.
  StreamReceiver(int fd, const std::filesystem::path& dir);
  ~StreamReceiver();  // waits for the thread
  StreamReceiver(const StreamReceiver&) = delete;
  StreamReceiver& operator=(const StreamReceiver&) = delete;
  // Receives the rest on a thread of its own, advancing arrival() as the bytes come in.
  void start();
  const image::BlobArrival& arrival() const { return *arrival_; }
  // Waits for the end marker (no byte past it is read: a commit line follows); returns the
  // payload bytes received. Rethrows the thread's error.
  std::uint64_t join();
  // The restore failed: the thread stops reading (its join() throws), so the sender sees the
  // connection close now instead of after the whole checkpoint.
  void cancel() { cancel_.notify(); }
  // When the end marker came (valid after join()).
  std::chrono::steady_clock::time_point ended() const { return ended_; }

 private:
  struct Blob;
  void piece(const std::string& name, std::uint64_t offset, std::uint64_t size);
  void receive_rest();
  int fd_;
  std::filesystem::path dir_;
  std::map<std::string, std::unique_ptr<Blob>> blobs_;
  std::vector<Blob*> order_;  // the manifest's blobs, in its order (arrival's indices)
  std::unique_ptr<image::BlobArrival> arrival_;
  std::vector<char> buf_;
  image::EventFd cancel_;
  std::uint64_t received_ = 0;
  std::chrono::steady_clock::time_point ended_{};
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace gpuckpt::remote
