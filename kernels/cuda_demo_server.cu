// gpuckpt-cuda-demo-server: a small CUDA serving workload, the real CUDA process of the GPU
// end-to-end checks. Its state lives in VRAM (plain cudaMalloc, never managed memory):
// "weights" (3/4 of --vram-gib, filled once) and a "KV cache" (1/4) that every request appends
// to. Line protocol on a unix stream socket:
//   PING        -> PONG
//   GEN <text>  -> OK <n> <hash>   mutates the KV cache with a kernel that depends on <text>,
//                                   the request count and the current VRAM contents
//   STATE       -> OK <n> <hash>   no mutation
//   INFO        -> INFO pid=.. device=.. uuid=.. vram_bytes=.. requests=..
// <hash> is a 64-bit checksum of ALL the VRAM state, computed on the GPU: it must be the same
// before a checkpoint and after the restore. Prints "READY <socket>" on stdout when serving.
//   gpuckpt-cuda-demo-server --socket PATH [--vram-gib G] [--seed S] [--device N] [--workers W]
//   gpuckpt-cuda-demo-server --client PATH 'REQUEST'   (no GPU needed: prints the reply)
// --workers W: a process tree, like a tensor-parallel server. The front (which never touches
// CUDA: a process that forks must not have initialised it) serves the socket and forks W
// workers; worker r holds --vram-gib/W of the state, seeded with S+r, on GPU (N+r) mod count.
// The front forwards each request to every worker over a socketpair and answers
// "OK <n> <hash>" with <hash> a fold of the workers' hashes; INFO adds workers= and
// worker_pids=. The workers die with the front (PR_SET_PDEATHSIG).
// Exit codes: 0 ok, 2 usage, 7 no GPU, 8 CUDA error, 10 client could not talk to a server.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_common.cuh"

using namespace gpuckpt_kernels;

namespace {

constexpr int kExitClient = 10;  // Errc::kProcess: the server did not answer
constexpr std::size_t kMaxLine = 1 << 16;
constexpr int kMaxClients = 64;
constexpr int kMaxWorkers = 64;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

// ---- device code ----------------------------------------------------------------------

__host__ __device__ inline std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__host__ __device__ inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

__global__ void fill_kernel(std::uint32_t* buf, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    buf[i] =
        mix32(static_cast<std::uint32_t>(i) ^ mix32(seed + static_cast<std::uint32_t>(i >> 32)));
}

// One "decode step": rewrites `count` consecutive KV words (a ring buffer, like appending to
// a KV cache) from their old value, the request hash and weights picked by the request. Each
// KV word is written by one thread only and weights are read-only: deterministic.
__global__ void gen_kernel(std::uint32_t* kv, std::size_t kv_words, const std::uint32_t* w,
                           std::size_t w_words, std::size_t start, std::size_t count,
                           std::uint64_t h) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t j = (start + i) % kv_words;
    const std::uint32_t wv = w[(i * 2654435761ull + h) % w_words];
    kv[j] = mix32(kv[j] ^ wv ^ static_cast<std::uint32_t>(h >> 32) ^ static_cast<std::uint32_t>(i));
  }
}

// Order-independent but position-sensitive checksum: the sum (mod 2^64) of
// mix64(mix64(tag ^ index) ^ word). mix64 is a bijection, so changing any one word changes its
// term; sums commute, so the result does not depend on scheduling.
__global__ void hash_kernel(const uint4* buf, std::size_t n4, std::uint64_t tag,
                            unsigned long long* out) {
  std::uint64_t sum = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n4;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const uint4 v = buf[i];
    const std::uint64_t k = tag ^ (i * 4);
    sum += mix64(mix64(k) ^ v.x) + mix64(mix64(k + 1) ^ v.y) + mix64(mix64(k + 2) ^ v.z) +
           mix64(mix64(k + 3) ^ v.w);
  }
  for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
  __shared__ std::uint64_t warp_sums[32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint64_t s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += warp_sums[w];
    atomicAdd(out, static_cast<unsigned long long>(s));
  }
}

// ---- the model state ----------------------------------------------------------------------

class Model {
 public:
  Model(std::size_t vram_bytes, std::uint32_t seed, int device) {
    cudaDeviceProp p{};
    GPUCKPT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    name_ = p.name;
    uuid_ = uuid_string(p.uuid);
    grid_ = p.multiProcessorCount * 8;
    // Whole uint4s in each buffer; weights 3/4, KV cache 1/4.
    kv_words_ = std::max<std::size_t>(4, (vram_bytes / 4) / 16 * 4);
    w_words_ = std::max<std::size_t>(4, (vram_bytes - kv_words_ * 4) / 16 * 4);
    kv_slice_ = std::min<std::size_t>(kv_words_, std::size_t(4) << 20);  // 16 MiB per step
    GPUCKPT_CUDA_CHECK(cudaMalloc(&w_, w_words_ * 4));
    GPUCKPT_CUDA_CHECK(cudaMalloc(&kv_, kv_words_ * 4));
    GPUCKPT_CUDA_CHECK(cudaMalloc(&sum_, sizeof(unsigned long long)));
    fill_kernel<<<grid_, 256>>>(w_, w_words_, seed);
    fill_kernel<<<grid_, 256>>>(kv_, kv_words_, ~seed);
    GPUCKPT_CUDA_CHECK(cudaGetLastError());
    GPUCKPT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Model() {
    cudaFree(w_);
    cudaFree(kv_);
    cudaFree(sum_);
  }

  void generate(const std::string& text) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the request, mixed with the count
    for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
    h = mix64(h ^ (requests_ + 1) * 0x9e3779b97f4a7c15ull);
    const std::size_t start = (requests_ * kv_slice_) % kv_words_;
    gen_kernel<<<grid_, 256>>>(kv_, kv_words_, w_, w_words_, start, kv_slice_, h);
    GPUCKPT_CUDA_CHECK(cudaGetLastError());
    GPUCKPT_CUDA_CHECK(cudaDeviceSynchronize());
    ++requests_;
  }

  std::uint64_t hash() {
    GPUCKPT_CUDA_CHECK(cudaMemset(sum_, 0, sizeof(unsigned long long)));
    hash_kernel<<<grid_, 256>>>(reinterpret_cast<const uint4*>(w_), w_words_ / 4, 0x57ull << 56,
                                sum_);
    hash_kernel<<<grid_, 256>>>(reinterpret_cast<const uint4*>(kv_), kv_words_ / 4, 0x4bull << 56,
                                sum_);
    GPUCKPT_CUDA_CHECK(cudaGetLastError());
    unsigned long long h = 0;
    GPUCKPT_CUDA_CHECK(cudaMemcpy(&h, sum_, sizeof h, cudaMemcpyDeviceToHost));
    return mix64(h ^ (w_words_ << 1) ^ kv_words_);
  }

  std::uint64_t requests() const { return requests_; }
  std::size_t bytes() const { return (w_words_ + kv_words_) * 4; }
  const std::string& name() const { return name_; }
  const std::string& uuid() const { return uuid_; }

 private:
  std::string name_, uuid_;
  int grid_ = 0;
  std::uint32_t* w_ = nullptr;
  std::uint32_t* kv_ = nullptr;
  unsigned long long* sum_ = nullptr;
  std::size_t w_words_ = 0, kv_words_ = 0, kv_slice_ = 0;
  std::uint64_t requests_ = 0;
};

std::string answer(Model& m, const std::string& line) {
  char buf[64];
  auto ok = [&] {
    std::snprintf(buf, sizeof buf, "OK %" PRIu64 " %016" PRIx64, m.requests(), m.hash());
    return std::string(buf);
  };
  if (line == "PING") return "PONG";
  if (line == "STATE") return ok();
  if (line.rfind("GEN ", 0) == 0 || line == "GEN") {
    m.generate(line.size() > 4 ? line.substr(4) : std::string());
    return ok();
  }
  if (line == "INFO")
    return "INFO pid=" + std::to_string(::getpid()) + " device=" + m.name() + " uuid=" + m.uuid() +
           " vram_bytes=" + std::to_string(m.bytes()) + " requests=" + std::to_string(m.requests());
  return "ERR unknown command (PING, GEN <text>, STATE, INFO)";
}

// ---- sockets -------------------------------------------------------------------------------

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) die(kExitUsage, "socket path too long: " + path);
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

bool write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

int run_client(const std::string& path, const std::string& request, int timeout_ms) {
  const sockaddr_un a = unix_address(path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    std::fprintf(stderr, "cannot connect to %s: %s\n", path.c_str(), std::strerror(errno));
    return kExitClient;
  }
  if (!write_all(fd, request + "\n")) {
    std::fprintf(stderr, "cannot send to %s: %s\n", path.c_str(), std::strerror(errno));
    return kExitClient;
  }
  std::string reply;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      std::fprintf(stderr, "no reply from %s within %d ms\n", path.c_str(), timeout_ms);
      return kExitClient;
    }
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "%s closed the connection without a full reply\n", path.c_str());
      return kExitClient;
    }
    if (c == '\n') break;
    reply += c;
  }
  ::close(fd);
  std::printf("%s\n", reply.c_str());
  return 0;
}

struct Client {
  int fd = -1;
  std::string in;
};

// Serves the line protocol on `path` with `answer` until SIGTERM/SIGINT.
int serve_loop(const std::string& path,
               const std::function<std::string(const std::string&)>& answer) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) die(kExitUsage, path + " exists and is not a socket");
    ::unlink(path.c_str());  // stale socket of an earlier run
  }
  const sockaddr_un a = unix_address(path);
  const int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(lfd, 16) != 0)
    die(kExitUsage, "cannot listen on " + path + ": " + std::strerror(errno));

  std::printf("READY %s\n", path.c_str());
  std::fflush(stdout);

  std::vector<Client> clients;
  while (!g_stop) {
    std::vector<pollfd> fds;
    fds.push_back({lfd, POLLIN, 0});
    for (const auto& c : clients) fds.push_back({c.fd, POLLIN, 0});
    const int r = ::poll(fds.data(), fds.size(), 500);  // wakes up to notice g_stop
    if (r < 0) {
      if (errno == EINTR) continue;
      die(kExitDevice, std::string("poll: ") + std::strerror(errno));
    }
    if (fds[0].revents & POLLIN) {
      const int cfd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (cfd >= 0) {
        if (clients.size() >= kMaxClients) {
          write_all(cfd, "ERR too many clients\n");
          ::close(cfd);
        } else {
          clients.push_back({cfd, {}});
        }
      }
    }
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Client& c = clients[k - 1];
      char buf[4096];
      const ssize_t n = ::read(c.fd, buf, sizeof buf);
      bool close_it = n <= 0 && !(n < 0 && errno == EINTR);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        std::size_t nl;
        while (!close_it && (nl = c.in.find('\n')) != std::string::npos) {
          std::string line = c.in.substr(0, nl);
          c.in.erase(0, nl + 1);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          close_it = !write_all(c.fd, answer(line) + "\n");
        }
        if (c.in.size() > kMaxLine) {
          write_all(c.fd, "ERR line too long\n");
          close_it = true;
        }
      }
      if (close_it) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    clients.erase(
        std::remove_if(clients.begin(), clients.end(), [](const Client& c) { return c.fd < 0; }),
        clients.end());
  }
  for (auto& c : clients) ::close(c.fd);
  ::close(lfd);
  ::unlink(path.c_str());
  return 0;
}

int serve(const std::string& path, double vram_gib, std::uint32_t seed, int device) {
  require_gpu(device);
  const std::size_t bytes = static_cast<std::size_t>(vram_gib * double(1ull << 30));
  Model model(bytes, seed, device);
  model.hash();  // warms every kernel up before the first request is timed by anyone
  return serve_loop(path, [&](const std::string& line) { return answer(model, line); });
}

// ---- the multi-process tree (--workers) ----------------------------------------------------

// One '\n'-terminated line from a blocking fd, without the newline; false on EOF or error.
bool read_line(int fd, std::string& buf, std::string& line) {
  for (;;) {
    if (const auto nl = buf.find('\n'); nl != std::string::npos) {
      line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return true;
    }
    char chunk[4096];
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || buf.size() > kMaxLine) return false;
    buf.append(chunk, static_cast<std::size_t>(n));
  }
}

// A worker: its share of the state on its GPU, answering the front's lines on `fd`.
int run_worker(int fd, std::size_t bytes, std::uint32_t seed, int device, int rank) {
  const int count = require_gpu(device);
  const int gpu = (device + rank) % count;
  GPUCKPT_CUDA_CHECK(cudaSetDevice(gpu));
  Model model(bytes, seed, gpu);
  model.hash();
  if (!write_all(fd, "READY\n")) return 0;
  std::string buf, line;
  while (read_line(fd, buf, line))
    if (!write_all(fd, answer(model, line) + "\n")) break;
  return 0;  // the front hung up
}

// "key=value" out of an INFO line; the device name runs up to " uuid=" (it has spaces).
std::string info_field(const std::string& info, const std::string& key) {
  const auto at = info.find(" " + key + "=");
  if (at == std::string::npos) return {};
  const auto begin = at + key.size() + 2;
  const auto end = key == "device" ? info.find(" uuid=", begin) : info.find(' ', begin);
  return info.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

struct Worker {
  pid_t pid = 0;
  int fd = -1;
  std::string buf;
};

// Sends `line` to every worker first (so their GPUs work at once), then collects the replies.
std::vector<std::string> broadcast(std::vector<Worker>& workers, const std::string& line) {
  for (std::size_t r = 0; r < workers.size(); ++r)
    if (!write_all(workers[r].fd, line + "\n"))
      die(kExitDevice,
          "worker " + std::to_string(r) + " (pid " + std::to_string(workers[r].pid) + ") is gone");
  std::vector<std::string> replies(workers.size());
  for (std::size_t r = 0; r < workers.size(); ++r)
    if (!read_line(workers[r].fd, workers[r].buf, replies[r]))
      die(kExitDevice, "worker " + std::to_string(r) + " (pid " + std::to_string(workers[r].pid) +
                           ") exited while answering");
  return replies;
}

std::string answer_tree(std::vector<Worker>& workers, const std::string& line) {
  const std::vector<std::string> replies = broadcast(workers, line);
  for (const auto& r : replies)
    if (r.rfind("ERR", 0) == 0) return r;
  if (line == "PING") return "PONG";
  if (line == "INFO") {
    std::string pids, uuids;
    std::uint64_t vram = 0;
    for (std::size_t r = 0; r < workers.size(); ++r) {
      pids += (r ? "," : "") + std::to_string(workers[r].pid);
      uuids += (r ? "," : "") + info_field(replies[r], "uuid");
      vram += std::strtoull(info_field(replies[r], "vram_bytes").c_str(), nullptr, 10);
    }
    return "INFO pid=" + std::to_string(::getpid()) + " workers=" + std::to_string(workers.size()) +
           " worker_pids=" + pids + " device=" + info_field(replies[0], "device") +
           " uuid=" + info_field(replies[0], "uuid") + " uuids=" + uuids +
           " vram_bytes=" + std::to_string(vram) +
           " requests=" + info_field(replies[0], "requests");
  }
  // GEN and STATE: "OK <n> <hash>" from every worker, with the same <n>.
  std::uint64_t n0 = 0, h = 0x243f6a8885a308d3ull;
  for (std::size_t r = 0; r < replies.size(); ++r) {
    unsigned long long n = 0, wh = 0;
    if (std::sscanf(replies[r].c_str(), "OK %llu %llx", &n, &wh) != 2)
      return "ERR worker " + std::to_string(r) + " answered '" + replies[r] + "'";
    if (r == 0) n0 = n;
    if (n != n0) return "ERR the workers disagree on the request count";
    h = mix64(h ^ wh);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "OK %" PRIu64 " %016" PRIx64, n0, h);
  return buf;
}

int serve_tree(const std::string& path, double vram_gib, std::uint32_t seed, int device,
               int count) {
  unix_address(path);  // a bad path is a usage error before anything is started
  const std::size_t bytes =
      static_cast<std::size_t>(vram_gib * double(1ull << 30) / static_cast<double>(count));
  const pid_t front = ::getpid();
  std::vector<Worker> workers;
  for (int r = 0; r < count; ++r) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      die(kExitDevice, std::string("socketpair: ") + std::strerror(errno));
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) die(kExitDevice, std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != front) ::_exit(1);  // the front died before prctl
      for (const Worker& w : workers) ::close(w.fd);
      ::close(sv[0]);
      ::signal(SIGPIPE, SIG_IGN);
      const int rc = run_worker(sv[1], bytes, seed + static_cast<std::uint32_t>(r), device, r);
      std::fflush(nullptr);
      ::_exit(rc);
    }
    ::close(sv[1]);
    workers.push_back({pid, sv[0], {}});
  }
  ::signal(SIGPIPE, SIG_IGN);
  for (std::size_t r = 0; r < workers.size(); ++r) {
    std::string line;
    if (read_line(workers[r].fd, workers[r].buf, line) && line == "READY") continue;
    // Its reason ("no NVIDIA GPU: ...") is on stderr already; exit with its code, and the
    // other workers die with the front.
    int st = 0;
    ::waitpid(workers[r].pid, &st, 0);
    std::fprintf(stderr, "worker %zu (pid %d) did not start\n", r,
                 static_cast<int>(workers[r].pid));
    std::exit(WIFEXITED(st) && WEXITSTATUS(st) != 0 ? WEXITSTATUS(st) : kExitDevice);
  }
  const int rc =
      serve_loop(path, [&](const std::string& line) { return answer_tree(workers, line); });
  // Hanging up ends each worker's loop; reap them so none outlives the front.
  for (Worker& w : workers) ::close(w.fd);
  for (Worker& w : workers) ::waitpid(w.pid, nullptr, 0);
  return rc;
}

[[noreturn]] void usage(const std::string& msg) {
  die(kExitUsage, msg +
                      "\nusage: gpuckpt-cuda-demo-server --socket PATH [--vram-gib G] [--seed S] "
                      "[--device N] [--workers W]\n       gpuckpt-cuda-demo-server --client PATH "
                      "'REQUEST' [--timeout-ms MS]");
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path, client_path, request;
  double vram_gib = 1.0;
  long seed = 1, device = 0, timeout_ms = 120000, workers = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + a);
      return argv[++i];
    };
    auto number = [&](double min, double max) {
      const std::string v = next();
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(d >= min && d <= max)) usage("bad value for " + a + ": " + v);
      return d;
    };
    if (a == "--socket") {
      socket_path = next();
    } else if (a == "--vram-gib") {
      vram_gib = number(1.0 / 1024, 4096);
    } else if (a == "--seed") {
      seed = static_cast<long>(number(0, 4294967295.0));
    } else if (a == "--device") {
      device = static_cast<long>(number(0, 1024));
    } else if (a == "--client") {
      client_path = next();
      request = next();
    } else if (a == "--workers") {
      const double w = number(1, kMaxWorkers);
      if (w != static_cast<long>(w)) usage("bad value for --workers: not a whole number");
      workers = static_cast<long>(w);
    } else if (a == "--timeout-ms") {
      timeout_ms = static_cast<long>(number(1, 3.6e6));
    } else if (a == "--help" || a == "-h") {
      usage("gpuckpt-cuda-demo-server: CUDA serving workload with its state in VRAM");
    } else {
      usage("unknown argument " + a);
    }
  }
  if (!client_path.empty()) return run_client(client_path, request, static_cast<int>(timeout_ms));
  if (socket_path.empty()) usage("--socket is required");
  if (workers > 0)
    return serve_tree(socket_path, vram_gib, static_cast<std::uint32_t>(seed),
                      static_cast<int>(device), static_cast<int>(workers));
  return serve(socket_path, vram_gib, static_cast<std::uint32_t>(seed), static_cast<int>(device));
}
