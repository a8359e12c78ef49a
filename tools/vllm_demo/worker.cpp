// A worker: one "tensor-parallel shard". It holds its weights in anonymous memory and the KV
// state of every session, takes each step from the shared-memory ring and answers partial
// logits on its unix socket.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "gpuckpt/error.h"
#include "shared.h"
#include "util/unique_fd.h"

namespace gpuckpt::vllm_demo {

namespace {

class Weights {
 public:
  Weights(std::uint64_t bytes, std::uint64_t seed) : words_(std::max<std::uint64_t>(bytes / 8, 1)) {
    // mmap rather than a vector: the weights are one large anonymous mapping, like a
    // runtime's host copy of its weights, and the kernel hands it out zeroed and lazily.
    void* p =
        ::mmap(nullptr, words_ * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw_errno(Errc::kIo, "mmap ", bytes, " bytes of weights");
    w_ = static_cast<std::uint64_t*>(p);
    for (std::uint64_t i = 0; i < words_; ++i) w_[i] = mix64(seed * kGolden + i);
  }
  ~Weights() { ::munmap(w_, words_ * 8); }
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;

  std::uint64_t at(std::uint64_t key) const { return w_[mix64(key) % words_]; }
  std::uint64_t hash() const { return XXH3_64bits(w_, words_ * 8); }

 private:
  std::uint64_t words_;
  std::uint64_t* w_;
};

// The KV state of one session in this shard: one entry per token, each chained to the one
// before and to the weights, so it depends on the whole history.
using Kv = std::vector<std::uint64_t>;

void append(Kv& kv, const Weights& w, int rank, const char* tokens, std::uint32_t n) {
  for (std::uint32_t t = 0; t < n; ++t) {
    Token tok;
    std::memcpy(&tok, tokens + t * sizeof tok, sizeof tok);  // the payload is not aligned
    const std::uint64_t i = kv.size();
    const std::uint64_t prev = i ? kv.back() : mix64(static_cast<std::uint64_t>(rank) + 1);
    kv.push_back(mix64(prev ^ (tok + 1ull) * kGolden ^ w.at(tok * kGolden ^ i)));
  }
}

// Reads every KV entry and samples the weights, so a restored process that lost or changed
// any of its state answers differently.
void logits(const Kv& kv, const Weights& w, std::uint64_t weights_hash, std::uint64_t* out) {
  std::uint64_t acc = weights_hash;
  for (std::uint64_t i = 0; i < kv.size(); ++i) acc += mix64(kv[i] ^ i * kGolden);
  for (int v = 0; v < kVocab; ++v) out[v] = mix64(acc ^ (v + 1ull) * kGolden) ^ w.at(acc + v);
}

}  // namespace

int run_worker(const WorkerOptions& o) {
  const std::string role = "worker " + std::to_string(o.rank);
  try {
    Weights weights(o.weights_bytes, o.seed + static_cast<std::uint64_t>(o.rank));
    // Stands for loading the model and initialising the runtime: a workload property, not
    // synchronisation.
    std::this_thread::sleep_for(std::chrono::duration<double>(o.init_seconds));

    ShmName name{};
    if (!read_all(o.socket, name.data(), name.size())) return 0;  // the engine is gone
    name.back() = '\0';
    Ring* ring;
    {
      UniqueFd fd(::shm_open(name.data(), O_RDWR | O_CLOEXEC, 0));
      if (!fd) throw_errno(Errc::kIo, "shm_open ", std::string(name.data()));
      void* p = ::mmap(nullptr, sizeof(Ring), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (p == MAP_FAILED) throw_errno(Errc::kIo, "mmap ", std::string(name.data()));
      ring = static_cast<Ring*>(p);
    }  // the mapping keeps the memory; the fd is not needed
    if (ring->magic != kRingMagic || o.rank >= static_cast<int>(ring->workers))
      throw Error(Errc::kInternal, "the ring " + std::string(name.data()) + " is not ours");
    std::uint64_t weights_hash = 0;  // of the request being served
    const Hello hello{static_cast<std::uint32_t>(o.rank), ::getpid()};
    if (!write_all(o.socket, &hello, sizeof hello)) return 0;

    std::map<std::string, Kv, std::less<>> sessions;
    for (std::uint64_t seq = ring->consumed[o.rank].load();; ++seq) {
      while (::sem_wait(&ring->wake[o.rank]) != 0)
        if (errno != EINTR) throw_errno(Errc::kInternal, "sem_wait");
      const Slot& s = ring->slots[seq % kSlots];
      if (s.seq != seq)
        throw Error(Errc::kInternal, "ring out of step at message " + std::to_string(seq));
      if (s.op == Op::kStop) return 0;
      const std::string_view session(s.payload, s.session_len);
      auto it = sessions.find(session);
      if (it == sessions.end()) it = sessions.emplace(std::string(session), Kv{}).first;
      if (s.flags & kFirstChunk) weights_hash = weights.hash();
      append(it->second, weights, o.rank, s.payload + s.session_len, s.tokens);
      Partial reply{seq, {}};
      logits(it->second, weights, weights_hash, reply.logits);
      ring->consumed[o.rank].store(seq + 1, std::memory_order_release);
      if (!write_all(o.socket, &reply, sizeof reply)) return 0;  // the engine is gone
    }
  } catch (const std::exception& e) {
    warn(role, e.what());
    return 1;
  }
}

}  // namespace gpuckpt::vllm_demo
