#include "util/fd_passing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gpuckpt {

int send_with_fds(int sock, std::string_view data, std::span<const int> fds) {
  if (data.empty() || fds.size() > kMaxFdsPerMessage) return EINVAL;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  // The descriptors go with the first byte; the rest of a stream is plain bytes.
  for (std::size_t sent = 0; sent < data.size();) {
    iov = {const_cast<char*>(data.data() + sent), data.size() - sent};
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    sent += static_cast<std::size_t>(n);
    msg.msg_control = nullptr;
    msg.msg_controllen = 0;
  }
  return 0;
}

ssize_t recv_with_fds(int sock, void* buf, std::size_t cap, std::vector<UniqueFd>& fds,
                      bool* truncated) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  iovec iov{buf, cap};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return errno == ENOTSOCK ? ::read(sock, buf, cap) : n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      fds.emplace_back(f);
    }
  }
  if (truncated) *truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  return n;
}

}  // namespace gpuckpt
