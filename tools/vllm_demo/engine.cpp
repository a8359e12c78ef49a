// The engine: the scheduler between the front and the workers. It creates the shared-memory
// ring, broadcasts every prefill chunk and decode step to all workers, sums their partial
// logits and picks each next token. Requests run one at a time, in the order they arrive.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "shared.h"
#include "util/unique_fd.h"

namespace gpuckpt::vllm_demo {

namespace {

// The ring's name while it is linked, for the signal handler: an engine ended by SIGTERM (the
// front's, or PR_SET_PDEATHSIG when the front died) must not leave the name in /dev/shm.
char g_shm_path[128];
void on_term(int sig) {
  if (g_shm_path[0]) ::unlink(g_shm_path);  // async-signal-safe, unlike shm_unlink
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered once the handler returns: the usual death by SIGTERM
}

class Engine {
 public:
  explicit Engine(const EngineOptions& o) : o_(o) {
    std::snprintf(name_.data(), name_.size(), "/gpuckpt-vllm-%d", ::getpid());
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    UniqueFd fd(::shm_open(name_.data(), flags, 0600));
    if (!fd && errno == EEXIST) {  // left by a killed engine that had our pid: ours to replace
      ::shm_unlink(name_.data());
      fd = UniqueFd(::shm_open(name_.data(), flags, 0600));
    }
    if (!fd) throw_errno(Errc::kIo, "shm_open ", name_.data());
    std::snprintf(g_shm_path, sizeof g_shm_path, "/dev/shm%s", name_.data());
    linked_ = true;
    struct sigaction sa {};
    sa.sa_handler = on_term;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    if (::ftruncate(fd.get(), sizeof(Ring)) != 0)
      throw_errno(Errc::kIo, "ftruncate ", name_.data());
    void* p = ::mmap(nullptr, sizeof(Ring), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) throw_errno(Errc::kIo, "mmap ", name_.data());
    ring_ = new (p) Ring{};
    ring_->magic = kRingMagic;
    ring_->workers = static_cast<std::uint32_t>(o.workers.size());
    for (std::size_t w = 0; w < o.workers.size(); ++w)
      if (::sem_init(&ring_->wake[w], /*pshared=*/1, 0) != 0) throw_errno(Errc::kIo, "sem_init");
  }
  ~Engine() {
    if (linked_) unlink_name();
    if (ring_) ::munmap(ring_, sizeof(Ring));
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Hands every worker the ring and waits until all have mapped it; then, like vLLM's shm
  // broadcast, the name goes (the mappings keep the memory) unless --keep-shm.
  nlohmann::json attach_workers() {
    nlohmann::json pids = nlohmann::json::array();
    for (int fd : o_.workers)
      if (!write_all(fd, name_.data(), name_.size())) throw_errno(Errc::kProcess, "to a worker");
    for (std::size_t w = 0; w < o_.workers.size(); ++w) {
      Hello h{};
      if (!read_all(o_.workers[w], &h, sizeof h))
        throw Error(Errc::kProcess, "worker " + std::to_string(w) + " exited before it was ready");
      pids.push_back(h.pid);
    }
    if (!o_.keep_shm) unlink_name();
    return {{"event", "ready"}, {"shm", name_.data()}, {"worker_pids", pids}};
  }

  // Broadcasts one message and, for a step, returns the next token's logits summed over the
  // workers (wrapping: every shard's bits count).
  std::array<std::uint64_t, kVocab> broadcast(Op op, std::string_view session,
                                              const std::vector<Token>& tokens,
                                              std::uint32_t flags) {
    const std::uint64_t seq = ring_->published.load(std::memory_order_relaxed);
    // Every worker answers a message before the next one is sent, so a slot is always free;
    // the check guards that invariant rather than waiting.
    for (std::size_t w = 0; w < o_.workers.size(); ++w)
      if (ring_->consumed[w].load(std::memory_order_acquire) + kSlots <= seq)
        throw Error(Errc::kInternal, "ring overrun by worker " + std::to_string(w));
    Slot& s = ring_->slots[seq % kSlots];
    s.seq = seq;
    s.op = op;
    s.flags = flags;
    s.session_len = static_cast<std::uint32_t>(session.size());
    s.tokens = static_cast<std::uint32_t>(tokens.size());
    // memcpy from an empty vector's null data() is undefined, even for 0 bytes.
    if (!session.empty()) std::memcpy(s.payload, session.data(), session.size());
    if (!tokens.empty())
      std::memcpy(s.payload + session.size(), tokens.data(), tokens.size() * sizeof(Token));
    ring_->published.store(seq + 1, std::memory_order_release);
    for (std::size_t w = 0; w < o_.workers.size(); ++w)
      if (::sem_post(&ring_->wake[w]) != 0) throw_errno(Errc::kInternal, "sem_post");

    std::array<std::uint64_t, kVocab> sum{};
    if (op == Op::kStop) return sum;
    for (std::size_t w = 0; w < o_.workers.size(); ++w) {
      Partial p{};
      if (!read_all(o_.workers[w], &p, sizeof p))
        throw Error(Errc::kProcess, "worker " + std::to_string(w) + " exited");
      if (p.seq != seq)
        throw Error(Errc::kInternal, "worker " + std::to_string(w) + " answered message " +
                                         std::to_string(p.seq) + " for " + std::to_string(seq));
      for (int v = 0; v < kVocab; ++v) sum[v] += p.logits[v];
    }
    return sum;
  }

  nlohmann::json complete(const nlohmann::json& req) {
    const std::string session = req.at("session");
    const std::string prompt = req.at("prompt");
    const int max_tokens = req.at("max_tokens");
    // Chunked prefill: a chunk is what fits in one slot next to the session id.
    const std::size_t chunk = (kSlotPayload - session.size()) / sizeof(Token);
    std::array<std::uint64_t, kVocab> logits{};
    std::size_t off = 0;
    do {
      const std::size_t n = std::min(chunk, prompt.size() - off);
      std::vector<Token> tokens(n);
      for (std::size_t i = 0; i < n; ++i) tokens[i] = static_cast<unsigned char>(prompt[off + i]);
      logits = broadcast(Op::kStep, session, tokens, off == 0 ? kFirstChunk : 0);
      off += n;
    } while (off < prompt.size());
    std::string text;
    for (int t = 0; t < max_tokens; ++t) {
      const int v =
          static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      text += ' ';
      text += kWords[v];
      // The sampled token joins the KV state with the next step, as in a real decode loop.
      if (t + 1 < max_tokens)
        logits = broadcast(Op::kStep, session, {static_cast<Token>(256 + v)}, 0);
    }
    return {{"id", req.at("id")},
            {"request", ++requests_},
            {"text", text},
            {"prompt_tokens", prompt.size()},
            {"completion_tokens", max_tokens}};
  }

  // After the front hung up: stop the workers and wait until each has closed its socket.
  void stop() {
    broadcast(Op::kStop, {}, {}, 0);
    for (int fd : o_.workers) {
      char c;
      while (::read(fd, &c, 1) > 0) {
      }
    }
  }

 private:
  void unlink_name() {
    ::shm_unlink(name_.data());
    g_shm_path[0] = '\0';  // after: a signal in between finds the name already gone
    linked_ = false;
  }

  const EngineOptions& o_;
  ShmName name_{};
  bool linked_ = false;
  Ring* ring_ = nullptr;
  std::uint64_t requests_ = 0;
};

// One '\n'-terminated line from a blocking socket; false on EOF.
bool read_line(int fd, std::string& buf, std::string& line) {
  constexpr std::size_t kMax = 8 << 20;  // the front caps bodies far below this
  for (;;) {
    if (const auto nl = buf.find('\n'); nl != std::string::npos) {
      line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return true;
    }
    if (buf.size() > kMax) throw Error(Errc::kInternal, "line from the front too long");
    char chunk[65536];
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(Errc::kIo, "reading from the front");
    if (n == 0) return false;
    buf.append(chunk, static_cast<std::size_t>(n));
  }
}

// False once the front is gone: then, as at EOF, the workers are stopped.
bool send_line(int fd, const nlohmann::json& j) {
  const std::string s = j.dump() + "\n";
  return write_all(fd, s.data(), s.size());
}

}  // namespace

int run_engine(const EngineOptions& o) {
  try {
    Engine engine(o);
    std::string buf, line;
    if (send_line(o.front, engine.attach_workers()))
      while (read_line(o.front, buf, line) &&
             send_line(o.front, engine.complete(nlohmann::json::parse(line)))) {
      }
    engine.stop();
    return 0;
  } catch (const std::exception& e) {
    warn("engine", e.what());
    return 1;
  }
}

}  // namespace gpuckpt::vllm_demo
