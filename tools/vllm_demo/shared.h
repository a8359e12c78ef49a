// gpuckpt-vllm-demo: what its three kinds of process (front, engine, workers) share: the
// shared-memory broadcast ring, the messages on the unix sockets, and the toy model's math.
// tools/README.md describes the demo; docs/PROCESS.md what a checkpoint has to carry.
#pragma once

#include <semaphore.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpuckpt::vllm_demo {

constexpr int kMaxWorkers = 64;
constexpr int kVocab = 64;
constexpr std::uint32_t kSlots = 4;
constexpr std::uint32_t kSlotPayload = 8192;  // bytes; longer prompts go in several chunks
constexpr std::size_t kMaxSession = 256;      // bytes of a session id
constexpr std::uint32_t kRingMagic = 0x67636b72;

using Token = std::uint16_t;  // 0..255: prompt bytes; 256 + v: generated word v

enum class Op : std::uint32_t { kStep = 1, kStop = 2 };

// One broadcast message: append `tokens` to the session's KV state, answer the next token's
// partial logits. kFirstChunk starts a request: the workers re-hash their whole weights then.
constexpr std::uint32_t kFirstChunk = 1;
struct Slot {
  std::uint64_t seq;
  Op op;
  std::uint32_t flags;
  std::uint32_t session_len, tokens;
  char payload[kSlotPayload];  // the session id, then `tokens` Tokens (unaligned)
};

// The ring in /dev/shm, created and initialised by the engine. Like vLLM's shm broadcast: one
// writer, every worker reads every message. Each worker has its own semaphore, so an idle
// worker blocks in sem_wait (a futex on this shared page) instead of spinning.
struct Ring {
  std::uint32_t magic, workers;
  std::atomic<std::uint64_t> published;              // messages written
  std::atomic<std::uint64_t> consumed[kMaxWorkers];  // messages each worker has taken
  sem_t wake[kMaxWorkers];
  Slot slots[kSlots];
};

// Worker -> engine over the worker's unix socket.
struct Hello {  // once the weights are loaded and the ring is mapped
  std::uint32_t rank;
  pid_t pid;
};
struct Partial {  // per step
  std::uint64_t seq;
  std::uint64_t logits[kVocab];
};
// Engine -> worker over the same socket, once: the ring's name, NUL-padded.
using ShmName = std::array<char, 64>;

inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// The generated "words": the vocabulary of the toy model.
inline constexpr std::array<std::string_view, kVocab> kWords = {
    "the",    "a",      "model",  "token",  "cache",  "state",  "restore", "check",
    "point",  "gpu",    "memory", "kernel", "stream", "page",   "frozen",  "thaw",
    "serve",  "query",  "answer", "prompt", "weight", "layer",  "head",    "value",
    "key",    "batch",  "decode", "fill",   "warm",   "cold",   "start",   "again",
    "fast",   "slow",   "bytes",  "image",  "disk",   "zstd",   "ring",    "front",
    "engine", "worker", "socket", "epoll",  "futex",  "shared", "mapped",  "ready",
    "river",  "stone",  "cloud",  "light",  "north",  "south",  "echo",    "delta",
    "amber",  "cedar",  "maple",  "ocean",  "pixel",  "quartz", "silver",  "tiger"};

// Errors of one process, to its stderr, prefixed with its role.
void warn(std::string_view role, const std::string& msg);

// Blocking I/O of whole buffers on a stream socket; false on EOF or error (errno set).
bool write_all(int fd, const void* data, std::size_t n);
bool read_all(int fd, void* data, std::size_t n);

struct WorkerOptions {
  int rank = 0;
  int socket = -1;  // to the engine
  std::uint64_t weights_bytes = 0;
  std::uint64_t seed = 1;
  double init_seconds = 0;
};
struct EngineOptions {
  int front = -1;            // to the front
  std::vector<int> workers;  // to each worker, by rank
  bool keep_shm = false;
};
// Process bodies: they return the exit code.
int run_worker(const WorkerOptions& o);
int run_engine(const EngineOptions& o);

}  // namespace gpuckpt::vllm_demo
