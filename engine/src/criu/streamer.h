// gpuckpt's side of CRIU's image-streamer protocol (`criu dump --stream`, `criu restore
// --stream`, CRIU's criu/img-streamer.c; docs/CRIU.md, "Streaming"):
//
//   * CRIU connects to a unix stream socket in its images directory (-D):
//     streamer-capture.sock on dump, streamer-serve.sock on restore; gpuckpt listens there.
//   * For every image file it opens, CRIU sends a request, a u32 length (host order) and an
//     img_streamer_request_entry protobuf (field 1: the file name).
//   * On restore gpuckpt answers with a u32 length and an img_streamer_reply_entry (field 1:
//     whether the file exists); for a missing file CRIU goes on as with ENOENT.
//   * Then CRIU passes one end of a fresh pipe (SCM_RIGHTS, with one dummy byte): the read
//     end on dump (CRIU writes the image into the pipe and closes it), the write end on restore
//     (gpuckpt writes the image and closes it). Several pipes are open at once (CRIU writes a
//     task's pagemap and pages images side by side), so every pipe is served concurrently.
//   * A name "IMAGE@OFFSET+LENGTH" (decimal bytes) asks for that range of IMAGE alone: gpuckpt's
//     CRIU takes a task's pages image as several streams (docs/CRIU.md, "Parallel copy"). A
//     range not inside the image is answered as a missing file.
//   * CRIU closes the socket when it has opened its last image; a fatal error on either side is
//     a broken pipe for the other.
//   * Files CRIU opens with O_FORCE_LOCAL (stats-dump, stats-restore, irmap-cache) and its log
//     stay in the images directory.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "image/event_fd.h"
#include "image/stream_pack.h"
#include "util/unique_fd.h"

namespace gpuckpt::criu {

inline constexpr const char* kCaptureSocket = "streamer-capture.sock";
inline constexpr const char* kServeSocket = "streamer-serve.sock";

// Why `criu --stream` cannot serve this run (CRIU options that need image files on disk, or an
// images directory whose socket path would not fit a sockaddr_un), or "" if it can.
std::string stream_unsupported_reason(const std::filesystem::path& images_dir,
                                      const std::vector<std::string>& criu_args);

// Serves `criu dump --stream -D dir`: every image CRIU sends goes into `packer` as it arrives.
class DumpStreamer {
 public:
  // Listens on dir/streamer-capture.sock (before criu starts) and serves it from a thread.
  DumpStreamer(const std::filesystem::path& dir, image::StreamPacker& packer);
  // Not finished: stops at once (CRIU, if still running, sees a broken pipe) and joins.
  ~DumpStreamer();
  DumpStreamer(const DumpStreamer&) = delete;
  DumpStreamer& operator=(const DumpStreamer&) = delete;

  // criu has exited: takes in what it sent (its socket and pipes are at end of file now) and
  // joins; rethrows the first error (an image that could not be stored).
  void finish();
  // The image files received, in arrival order.
  std::vector<std::string> files() const;

 private:
  void run();
  image::StreamPacker& packer_;
  std::filesystem::path socket_path_;
  UniqueFd listen_;
  image::EventFd stop_;
  std::atomic<int> stop_mode_{0};  // 1: criu exited, drain; 2: abandon
  mutable std::mutex mu_;
  std::vector<std::string> files_;
  std::exception_ptr error_;
  std::thread thread_;
};

// Serves `criu restore --stream -D dir` from a checkpoint: each requested image is read from
// the blobs, verified, decompressed and written into CRIU's pipe by a thread of its own.
class RestoreStreamer {
 public:
  RestoreStreamer(const std::filesystem::path& dir, const image::CheckpointSource& source);
  ~RestoreStreamer();
  RestoreStreamer(const RestoreStreamer&) = delete;
  RestoreStreamer& operator=(const RestoreStreamer&) = delete;

  // criu has exited: joins every thread; rethrows the first error (Error(kCorrupt) for a damaged
  // chunk, which CRIU saw as a truncated image).
  void finish();
  // Whether an error has been recorded (a corrupt chunk), for the caller's message.
  bool failed() const;
  // Names CRIU asked for that the checkpoint does not hold (normal: optional images).
  std::vector<std::string> missing() const;
  std::uint64_t files_served() const { return served_.load(); }

 private:
  void run();
  struct Range {
    std::uint64_t offset = 0, length = 0;
  };
  void serve(const image::ManifestEntry* e, std::optional<Range> range, UniqueFd pipe);
  // The entry `name` asks for: a file, or (IMAGE@OFFSET+LENGTH) a range of one, into `range`;
  // nullptr if there is none.
  const image::ManifestEntry* find_range(const std::string& name,
                                         std::optional<Range>& range) const;
  void fail(std::exception_ptr e);
  const image::CheckpointSource& source_;
  std::filesystem::path socket_path_;
  UniqueFd listen_;
  image::EventFd stop_;
  std::atomic<int> stop_mode_{0};
  std::atomic<std::uint64_t> served_{0};
  mutable std::mutex mu_;
  std::vector<std::string> missing_;
  std::exception_ptr error_;
  std::vector<std::thread> servers_;
  std::thread thread_;
};

}  // namespace gpuckpt::criu
