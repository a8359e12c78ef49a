#include "probe/probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "gpuckpt/error.h"
#include "util/poll_timeout.h"
#include "util/unique_fd.h"

namespace gpuckpt {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A reply line or a partial stdout line is capped so a misbehaving peer cannot grow us forever.
constexpr size_t kMaxLine = 1 << 20;

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
  int pr = ::poll(&p, 1, std::min(poll_timeout_ms(deadline), 1000));
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
  // Owned at once: connect_once throws on a failing socket() or poll().
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(res, &::freeaddrinfo);
  UniqueFd fd;
  for (addrinfo* ai = res; ai && !fd; ai = ai->ai_next)
    fd = connect_once(ai->ai_addr, ai->ai_addrlen, deadline, err);
  return fd;
}

// Sends all of `msg`; false (with `err`) past the deadline or if the peer is gone.
bool send_all(int fd, const std::string& msg, Clock::time_point deadline, std::string& err) {
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
    if (::poll(&p, 1, poll_timeout_ms(deadline)) == 0) {
      err = "connected, but the request could not be sent";
      return false;
    }
  }
  return true;
}

// Sends request + '\n' and reads one reply line. False (with `err`) if the peer closed first
// or the deadline passed; the caller retries.
bool exchange(int fd, const std::string& request, Clock::time_point deadline, std::string& reply,
              std::string& err) {
  if (!send_all(fd, request + "\n", deadline, err)) return false;
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
    int pr = ::poll(&p, 1, poll_timeout_ms(deadline));
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

// Appends what arrives on `fd` before the deadline to `buf`: 1 if some bytes came, 0 at EOF,
// -1 on an error or timeout (with `err`).
int recv_some(int fd, Clock::time_point deadline, std::string& buf, std::string& err) {
  char chunk[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int pr = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (pr < 0 && errno != EINTR) throw_errno(Errc::kInternal, "poll");
    if (pr == 0) {
      err = "connected, but no HTTP answer in time";
      return -1;
    }
    if (pr < 0) continue;
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      err = std::string("reading the answer failed: ") + std::strerror(errno);
      return -1;
    }
    buf.append(chunk, static_cast<size_t>(n));
    return n > 0 ? 1 : 0;
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// One HTTP/1.1 request (GET, or POST of probe.request) with Connection: close. True on a 2xx
// answer; `reply` is then the first line of its body, or its status line if the body is empty.
// Any other status is a failed attempt: a server that is still loading answers 503.
bool http_exchange(int fd, const ReadinessProbe& probe, Clock::time_point deadline,
                   std::string& reply, std::string& err) {
  constexpr size_t kMaxHead = 64 << 10;
  std::string msg = (probe.request.empty() ? "GET " : "POST ") + probe.path +
                    " HTTP/1.1\r\nHost: " + probe.target +
                    "\r\nUser-Agent: gpuckpt-probe\r\nAccept: */*\r\nConnection: close\r\n";
  if (!probe.request.empty())
    msg += "Content-Type: application/json\r\nContent-Length: " +
           std::to_string(probe.request.size()) + "\r\n";
  msg += "\r\n" + probe.request;
  if (!send_all(fd, msg, deadline, err)) return false;

  std::string buf;
  size_t head_end;
  while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
    // A line-protocol server answers at once, and not in HTTP: say so rather than wait.
    const size_t n = std::min<size_t>(buf.size(), 5);
    if (buf.compare(0, n, "HTTP/", n) != 0) {
      err = "not an HTTP answer: '" + buf.substr(0, std::min(buf.find('\n'), size_t{80})) + "'";
      return false;
    }
    if (buf.size() > kMaxHead) {
      err = "HTTP answer header longer than " + std::to_string(kMaxHead) + " bytes";
      return false;
    }
    const int r = recv_some(fd, deadline, buf, err);
    if (r < 0) return false;
    if (r == 0) {
      err = buf.empty() ? "connection closed before an HTTP answer"
                        : "connection closed inside the HTTP answer header";
      return false;
    }
  }
  const std::string status = buf.substr(0, buf.find("\r\n"));
  // "HTTP/1.1 200 OK": the code is the second word.
  const auto sp = status.find(' ');
  const int code = status.rfind("HTTP/", 0) == 0 && sp != std::string::npos
                       ? std::atoi(status.c_str() + sp + 1)
                       : 0;
  if (code < 100 || code > 599) {
    err = "not an HTTP answer: '" + status.substr(0, 80) + "'";
    return false;
  }
  if (code < 200 || code > 299) {
    err = "answered " + status.substr(0, 200);
    return false;
  }

  std::optional<size_t> length;
  bool chunked = false;
  for (size_t pos = buf.find("\r\n") + 2; pos < head_end;) {
    const size_t eol = buf.find("\r\n", pos);
    const std::string line = buf.substr(pos, eol - pos);
    pos = eol + 2;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = lower(line.substr(0, colon));
    std::string value = lower(line.substr(colon + 1));
    value.erase(0, value.find_first_not_of(" \t"));
    if (name == "content-length") length = std::strtoull(value.c_str(), nullptr, 10);
    if (name == "transfer-encoding") chunked = value.find("chunked") != std::string::npos;
  }
  // The first body line is enough: stop at it, at the end of the body, at EOF or at the cap.
  std::string body = buf.substr(head_end + 4);
  auto first_line = [&]() -> std::optional<std::string> {
    std::string data = body;
    std::optional<size_t> limit = length;
    if (chunked) {  // only the first chunk: "<hex size>[;ext]\r\n<data>"
      const auto eol = data.find("\r\n");
      if (eol == std::string::npos) return std::nullopt;
      limit = std::strtoull(data.c_str(), nullptr, 16);
      data = data.substr(eol + 2);
    }
    if (limit) data.resize(std::min(data.size(), *limit));
    const auto nl = data.find('\n');
    if (nl != std::string::npos) return data.substr(0, nl);
    if ((limit && data.size() >= *limit) || data.size() >= kMaxLine)
      return data.substr(0, kMaxLine);
    return std::nullopt;
  };
  std::optional<std::string> line;
  while (!(line = first_line())) {
    std::string more_err;
    const int r = recv_some(fd, deadline, body, more_err);
    if (r <= 0) {  // the 2xx is the answer; a body cut short only shortens what we report
      line = chunked ? std::string() : body.substr(0, std::min(body.size(), kMaxLine));
      break;
    }
  }
  if (!line->empty() && line->back() == '\r') line->pop_back();
  reply = line->empty() ? status : *line;
  return true;
}

}  // namespace

ReadinessProbe parse_probe(const std::string& spec) {
  ReadinessProbe p;
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const std::string expect =
      "expected unix:PATH, tcp:HOST:PORT, http://HOST:PORT/PATH or stdout:TEXT";
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
  } else if (kind == "http") {
    const std::string bad = "bad readiness probe '" + spec + "': ";
    if (rest.rfind("//", 0) != 0) throw Error(Errc::kUsage, bad + "expected http://HOST:PORT/PATH");
    const auto slash = rest.find('/', 2);
    const std::string host_port = rest.substr(2, slash == std::string::npos ? slash : slash - 2);
    std::string host, port;
    if (!split_host_port(host_port, host, port))
      throw Error(Errc::kUsage, bad + "expected http://HOST:PORT/PATH with a port in 1..65535");
    p.path = slash == std::string::npos ? "/" : rest.substr(slash);
    // The path goes verbatim into the request line: no spaces or control characters.
    if (!std::all_of(p.path.begin(), p.path.end(),
                     [](unsigned char c) { return c > 0x20 && c < 0x7f; }))
      throw Error(Errc::kUsage, bad + "the path must be URL-encoded (no spaces or controls)");
    p.kind = ReadinessProbe::Kind::kHttp;
    p.target = host_port;
    return p;
  } else if (kind == "https") {
    throw Error(Errc::kUsage, "bad readiness probe '" + spec +
                                  "': https is not supported; probe the plain-HTTP port");
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
    case ReadinessProbe::Kind::kHttp:
      return "http://" + probe.target + probe.path;
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
                                  "itself; use unix:PATH, tcp:HOST:PORT or http://HOST:PORT/PATH");
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
  // The deadline often cuts the last attempt short, so the message also says why the attempts
  // before it failed: the latest error unlike the last one.
  std::string last, before;
  for (;;) {
    UniqueFd fd = probe.kind == K::kUnix ? connect_unix(probe.target, deadline, err)
                                         : connect_tcp(probe.target, deadline, err);
    if (fd && probe.kind == K::kHttp) {
      std::string reply;
      if (http_exchange(fd.get(), probe, deadline, reply, err)) return reply;
    } else if (fd) {
      if (probe.request.empty()) return {};
      std::string reply;
      if (exchange(fd.get(), probe.request, deadline, reply, err)) return reply;
    }
    if (err != last) before = std::exchange(last, err);
    if (Clock::now() >= deadline) break;
    if (between_attempts) between_attempts();
    std::this_thread::sleep_for(
        std::min<Clock::duration>(sleep, std::max<Clock::duration>(deadline - Clock::now(), {})));
    sleep = std::min(sleep * 2, std::chrono::microseconds(10000));
  }
  throw Error(Errc::kTimeout,
              "readiness probe " + describe_probe(probe) + " did not succeed within " +
                  std::to_string(probe.timeout.count()) + " ms (last attempt: " + err +
                  (before.empty() ? "" : "; before that: " + before) + ")");
}

std::string wait_for_line(int fd, const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string line;  // the current, not yet complete, line
  char chunk[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int pr = ::poll(&p, 1, poll_timeout_ms(deadline));
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

std::string ask_unix_line(const std::filesystem::path& socket, const std::string& line,
                          std::chrono::milliseconds timeout) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (!fd || socket.native().size() >= sizeof a.sun_path) return "";
  std::memcpy(a.sun_path, socket.c_str(), socket.native().size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timeval tv{static_cast<time_t>(secs.count()),
             static_cast<suseconds_t>((timeout - secs).count() * 1000)};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = line + "\n";
  if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
    return "";
  std::string out;
  char c;
  while (out.size() < kMaxLine && ::recv(fd.get(), &c, 1, 0) == 1 && c != '\n') out += c;
  return out;
}

}  // namespace gpuckpt
