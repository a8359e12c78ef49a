// gpuckpt-demo-server: a stand-in for an LLM serving process, for cold-start and
// checkpoint/restore tests without a GPU. See tools/README.md for the protocol.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "model.h"
#include "util/unique_fd.h"

namespace {

using gpuckpt::Errc;
using gpuckpt::UniqueFd;

volatile sig_atomic_t g_stop = 0;
void on_term(int) {
  g_stop = 1;
}

UniqueFd listen_unix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    throw gpuckpt::Error(Errc::kUsage, "socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) gpuckpt::throw_errno(Errc::kIo, "socket");
  ::unlink(path.c_str());  // a stale socket file from an earlier run
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    gpuckpt::throw_errno(Errc::kIo, "bind ", path);
  if (::listen(fd.get(), 16) != 0) gpuckpt::throw_errno(Errc::kIo, "listen ", path);
  return fd;
}

std::string format_reply(const gpuckpt::demo::Model::Reply& r) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "OK %" PRIu64 " %016" PRIx64 " %" PRIu64 "\n", r.requests, r.hash,
                r.kv_bytes);
  return buf;
}

bool write_all(int fd, const std::string& s) {
  for (std::size_t off = 0; off < s.size();) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

// Serves one connection until the peer closes it. Returns false on QUIT.
bool serve_client(int fd, gpuckpt::demo::Model& model) {
  std::string buf;
  char chunk[4096];
  for (;;) {
    std::size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::string reply;
      if (line == "PING") {
        reply = "PONG\n";
      } else if (line == "STATE") {
        reply = format_reply(model.state());
      } else if (line.rfind("GEN ", 0) == 0) {
        try {
          reply = format_reply(model.generate(std::string_view(line).substr(4)));
        } catch (const gpuckpt::Error& e) {
          reply = std::string("ERR ") + e.what() + "\n";
        }
      } else if (line == "WEIGHTS") {
        char b[64];
        std::snprintf(b, sizeof b, "OK %016" PRIx64 " %" PRIu64 "\n", model.weights_hash(),
                      model.weights_bytes());
        reply = b;
      } else if (line == "QUIT") {
        write_all(fd, "BYE\n");
        return false;
      } else {
        reply = "ERR unknown command\n";
      }
      if (!write_all(fd, reply)) return true;
    }
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) {
      if (g_stop) return false;
      continue;
    }
    if (n <= 0) return true;
    buf.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpuckpt-demo-server: a serving process stand-in (weights, init delay, KV state)"};
  std::string socket_path, weights, generate, size = "0", kv_per_request = "1M", kv_max = "1G";
  double init_seconds = 0;
  app.add_option("--socket", socket_path, "Unix socket to answer on");
  app.add_option("--weights", weights, "Weights file loaded into memory at start");
  app.add_option("--init-seconds", init_seconds, "Runtime-init delay before READY");
  app.add_option("--kv-per-request", kv_per_request, "KV-cache bytes appended per GEN");
  app.add_option("--kv-max", kv_max, "KV-cache capacity");
  app.add_option("--generate-weights", generate, "Write a weights file and exit");
  app.add_option("--size", size, "Size for --generate-weights (e.g. 4G)");
  std::string content = "bf16";
  app.add_option("--content", content,
                 "Content for --generate-weights: bf16 (bf16-like tensors) or mixed (half "
                 "random, half fp16-like)")
      ->check(CLI::IsMember({"bf16", "mixed"}));
  CLI11_PARSE(app, argc, argv);

  try {
    if (!generate.empty()) {
      gpuckpt::demo::generate_weights(generate, gpuckpt::parse_bytes(size),
                                      content == "mixed" ? gpuckpt::demo::WeightsContent::kMixed
                                                         : gpuckpt::demo::WeightsContent::kBf16);
      return 0;
    }
    if (socket_path.empty()) throw gpuckpt::Error(Errc::kUsage, "--socket is required");
    struct sigaction sa {};
    sa.sa_handler = on_term;  // no SA_RESTART: a blocked accept() returns EINTR
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);

    gpuckpt::demo::Model model(weights, gpuckpt::parse_bytes(kv_per_request),
                               gpuckpt::parse_bytes(kv_max));
    std::this_thread::sleep_for(std::chrono::duration<double>(init_seconds));
    UniqueFd listener = listen_unix(socket_path);
    std::printf("READY %s\n", socket_path.c_str());
    std::fflush(stdout);

    while (!g_stop) {
      // Bounded wait instead of a bare accept(): a SIGTERM that lands between the g_stop check
      // and accept() would otherwise be missed until the next client.
      pollfd p{listener.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, 100);
      if (ready < 0 && errno != EINTR) gpuckpt::throw_errno(Errc::kIo, "poll");
      if (ready <= 0) continue;
      UniqueFd client(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!client) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        gpuckpt::throw_errno(Errc::kIo, "accept");
      }
      if (!serve_client(client.get(), model)) break;
    }
    ::unlink(socket_path.c_str());
    return 0;
  } catch (const gpuckpt::Error& e) {
    std::cerr << "gpuckpt-demo-server: " << e.what() << "\n";
    return static_cast<int>(e.code());
  }
}
