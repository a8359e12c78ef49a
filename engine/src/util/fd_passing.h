// Descriptors passed over a unix socket (SCM_RIGHTS) with the bytes they travel with: criu's
// streamer pipes, and the process locks a gpuckpt shares with its guard.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "util/unique_fd.h"

namespace gpuckpt {

// The kernel's limit on descriptors in one message (SCM_MAX_FD), less a margin.
inline constexpr std::size_t kMaxFdsPerMessage = 250;

// Sends `data` on the stream socket `sock`, its first byte carrying `fds` (at most
// kMaxFdsPerMessage; descriptors travel only with data, so `data` must not be empty), then the
// rest of it as write_fully does. The receiver holds its own references to the same open files
// (and so the same flocks) once it has read that byte. Never raises SIGPIPE. Returns 0, or the
// errno of the call that failed (EINVAL for an empty `data` or too many descriptors).
int send_with_fds(int sock, std::string_view data, std::span<const int> fds);

// Reads at most `cap` bytes from `sock` into `buf`, as read() does, and appends the descriptors
// that came with them to `fds` (close-on-exec). On a descriptor that is not a socket (a pipe),
// it is read(). Returns what the call returned (-1 with errno set); `truncated`, when given, is
// set if the kernel dropped descriptors for lack of room (MSG_CTRUNC).
ssize_t recv_with_fds(int sock, void* buf, std::size_t cap, std::vector<UniqueFd>& fds,
                      bool* truncated = nullptr);

}  // namespace gpuckpt
