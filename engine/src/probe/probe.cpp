#include "probe/probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "gpuckpt/error.h"
#include "util/unique_fd.h"

namespace gpuckpt {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A reply line or a partial stdout line is capped so a misbehaving peer cannot grow us forever.
constexpr size_t kMaxLine = 1 << 20;

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Splits "HOST:PORT" / "[V6]:PORT" at the last ':'; false if malformed.
bool split_host_port(const std::string& s, std::string& host, std::string& port) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  host = s.substr(0, colon);
  port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty() || port.empty() || port.size() > 5) return false;
  if (!std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  const int p = std::stoi(port);
  return p >= 1 && p <= 65535;
}

// One non-blocking connect, bounded by `deadline`. Returns an invalid fd and sets `err` on
// failure ("Connection refused", "No such file or directory", ...).
UniqueFd connect_once(const sockaddr* sa, socklen_t len, Clock::time_point deadline,
                      std::string& err) {
  UniqueFd fd(::socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(Errc::kInternal, "socket");
  if (::connect(fd.get(), sa, len) == 0) return fd;
  if (errno != EINPROGRESS && errno != EINTR) {
    // A unix socket with a full backlog answers EAGAIN: busy, so try again like a refusal.
    err = std::strerror(errno);
    return {};
  }
  // Cap one connect at 1 s so a black-holed address is retried rather than waited on forever.
  pollfd p{fd.get(), POLLOUT, 0};
  int pr = ::poll(&p, 1, std::min(ms_left(deadline), 1000));
  if (pr < 0 && errno != EINTR) throw_errno(Errc::kInternal, "poll");
  if (pr <= 0) {
    err = "connect did not complete";
    return {};
  }
  int so_err = 0;
  socklen_t sl = sizeof so_err;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_err, &sl) != 0)
    throw_errno(Errc::kInternal, "getsockopt");
  if (so_err != 0) {
    err = std::strerror(so_err);
    return {};
  }
  return fd;
}

UniqueFd connect_unix(const std::string& path, Clock::time_point deadline, std::string& err) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  socklen_t len;
  if (!path.empty() && path[0] == '@') {  // Linux abstract namespace: leading NUL, no file
    std::memcpy(sa.sun_path + 1, path.data() + 1, path.size() - 1);
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  } else {
    std::memcpy(sa.sun_path, path.data(), path.size());
    len = static_cast<socklen_t>(sizeof sa);
  }
  return connect_once(reinterpret_cast<const sockaddr*>(&sa), len, deadline, err);
}

UniqueFd connect_tcp(const std::string& target, Clock::time_point deadline, std::string& err) {
  std::string host, port;
  if (!split_host_port(target, host, port))
    throw Error(Errc::kUsage, "bad TCP probe target '" + target + "': expected HOST:PORT");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  // Resolved on every attempt: a name may only appear once the service (or its DNS) is up.
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    err = std::string("cannot resolve ") + host + ": " + ::gai_strerror(rc);
    return {};
  }
  UniqueFd fd;
  for (addrinfo* ai = res; ai && !fd; ai = ai->ai_next)
    fd = connect_once(ai->ai_addr, ai->ai_addrlen, deadline, err);
  ::freeaddrinfo(res);
  return fd;
}

// Sends request + '\n' and reads one reply line. False (with `err`) if the peer closed first
// or the deadline passed; the caller retries.
bool exchange(int fd, const std::string& request, Clock::time_point deadline, std::string& reply,
              std::string& err) {
  const std::string msg = request + "\n";
  size_t off = 0;
  while (off < msg.size()) {
    ssize_t n = ::send(fd, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n >= 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = std::string("sending the request failed: ") + std::strerror(errno);
      return false;
    }
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, ms_left(deadline)) == 0) {
      err = "connected, but the request could not be sent";
      return false;
    }
  }
  std::string buf;
  char chunk[4096];
  for (;;) {
    const auto nl = buf.find('\n');
    if (nl != std::string::npos || buf.size() >= kMaxLine) {
      reply = buf.substr(0, std::min(nl, kMaxLine));
      if (!reply.empty() && reply.back() == '\r') reply.pop_back();
      return true;
    }
    pollfd p{fd, POLLIN, 0};
    int pr = ::poll(&p, 1, ms_left(deadline));
    if (pr < 0 && errno != EINTR) throw_errno(Errc::kInternal, "poll");
    if (pr == 0) {
      err = "connected, but no reply line to '" + request + "'";
      return false;
    }
    if (pr < 0) continue;
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      err = std::string("reading the reply failed: ") + std::strerror(errno);
      return false;
    }
    if (n == 0) {
      err = "connection closed before a reply line";
      return false;
    }
    buf.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace

ReadinessProbe parse_probe(const std::string& spec) {
  ReadinessProbe p;
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const std::string expect = "expected unix:PATH, tcp:HOST:PORT or stdout:TEXT";
  if (colon == std::string::npos)
    throw Error(Errc::kUsage, "bad readiness probe '" + spec + "': " + expect);
  if (kind == "unix") {
    if (rest.empty()) throw Error(Errc::kUsage, "bad readiness probe '" + spec + "': empty path");
    if (rest.size() >= sizeof(sockaddr_un::sun_path))
      throw Error(Errc::kUsage, "bad readiness probe '" + spec + "': socket path longer than " +
                                    std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
    p.kind = ReadinessProbe::Kind::kUnix;
  } else if (kind == "tcp") {
    std::string host, port;
    if (!split_host_port(rest, host, port))
      throw Error(Errc::kUsage, "bad readiness probe '" + spec +
                                    "': expected tcp:HOST:PORT with a port in 1..65535");
    p.kind = ReadinessProbe::Kind::kTcp;
  } else if (kind == "stdout") {
    if (rest.empty())
      throw Error(Errc::kUsage, "bad readiness probe '" + spec + "': empty text to wait for");
    p.kind = ReadinessProbe::Kind::kStdoutLine;
  } else {
    throw Error(Errc::kUsage, "bad readiness probe '" + spec + "': " + expect);
  }
  p.target = rest;
  return p;
}

std::string describe_probe(const ReadinessProbe& probe) {
  switch (probe.kind) {
    case ReadinessProbe::Kind::kUnix:
      return "unix:" + probe.target;
    case ReadinessProbe::Kind::kTcp:
      return "tcp:" + probe.target;
    case ReadinessProbe::Kind::kStdoutLine:
      return "stdout:" + probe.target;
    case ReadinessProbe::Kind::kNone:
      break;
  }
  return "none";
}

std::string wait_ready(const ReadinessProbe& probe) {
  return wait_ready(probe, {});
}

void require_socket_probe(const ReadinessProbe& probe) {
  if (probe.kind == ReadinessProbe::Kind::kStdoutLine)
    throw Error(Errc::kUsage, "readiness probe " + describe_probe(probe) +
                                  ": a stdout probe can only watch a process gpuckpt starts "
                                  "itself; use unix:PATH or tcp:HOST:PORT");
}

std::string wait_ready(const ReadinessProbe& probe, const std::function<void()>& between_attempts) {
  using K = ReadinessProbe::Kind;
  if (probe.kind == K::kNone) return {};
  require_socket_probe(probe);
  const auto start = Clock::now();
  const auto deadline = start + probe.timeout;
  // Short back-off: the probe's polling granularity is part of every measured restore time.
  auto sleep = std::chrono::microseconds(500);
  std::string err = "no attempt made";
  for (;;) {
    UniqueFd fd = probe.kind == K::kUnix ? connect_unix(probe.target, deadline, err)
                                         : connect_tcp(probe.target, deadline, err);
    if (fd) {
      if (probe.request.empty()) return {};
      std::string reply;
      if (exchange(fd.get(), probe.request, deadline, reply, err)) return reply;
    }
    if (Clock::now() >= deadline) break;
    if (between_attempts) between_attempts();
    std::this_thread::sleep_for(
        std::min<Clock::duration>(sleep, std::max<Clock::duration>(deadline - Clock::now(), {})));
    sleep = std::min(sleep * 2, std::chrono::microseconds(10000));
  }
  throw Error(Errc::kTimeout,
              "readiness probe " + describe_probe(probe) + " did not succeed within " +
                  std::to_string(probe.timeout.count()) + " ms (last attempt: " + err + ")");
}

std::string wait_for_line(int fd, const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string line;  // the current, not yet complete, line
  char chunk[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int pr = ::poll(&p, 1, ms_left(deadline));
    if (pr < 0 && errno != EINTR) throw_errno(Errc::kInternal, "poll");
    if (pr == 0)
      throw Error(Errc::kTimeout, "no line containing '" + text + "' on stdout within " +
                                      std::to_string(timeout.count()) + " ms");
    if (pr < 0) continue;
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) throw_errno(Errc::kProcess, "reading the service's stdout");
    if (n == 0)
      throw Error(Errc::kProcess, "stdout closed before a line containing '" + text + "' appeared");
    for (ssize_t i = 0; i < n; ++i) {
      if (chunk[i] != '\n') {
        line.push_back(chunk[i]);
        continue;
      }
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find(text) != std::string::npos) return line;
      line.clear();
    }
    if (line.find(text) != std::string::npos) return line;
    // An endless line without the text: keep only what could still complete a match.
    if (line.size() > kMaxLine && line.size() > text.size())
      line.erase(0, line.size() - text.size());
  }
}

}  // namespace gpuckpt
