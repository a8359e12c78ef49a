#include "model.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gpuckpt/error.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace gpuckpt::demo {

AnonMemory::AnonMemory(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
              -1, 0);
  if (p_ == MAP_FAILED) {
    p_ = nullptr;
    throw_errno(Errc::kIo, "mmap ", bytes, " bytes");
  }
}

AnonMemory::AnonMemory(AnonMemory&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}

AnonMemory& AnonMemory::operator=(AnonMemory&& o) noexcept {
  if (this != &o) {
    if (p_) ::munmap(p_, size_);
    p_ = std::exchange(o.p_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

AnonMemory::~AnonMemory() {
  if (p_) ::munmap(p_, size_);
}

void generate_weights(const std::filesystem::path& path, std::uint64_t size,
                      WeightsContent content) {
  const auto tmp = temp_sibling(path);
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) throw_errno(Errc::kIo, "create ", tmp);
    // Weights look like bf16 tensors: random sign/mantissa, clustered exponents, so they
    // compress a little, as real checkpoints do.
    std::mt19937_64 rng(0x5eed);
    std::vector<std::uint16_t> buf(1 << 20);
    for (std::uint64_t done = 0; done < size;) {
      if (content == WeightsContent::kMixed && done < size / 2) {
        // Incompressible: zstd stores these chunks raw.
        for (std::size_t i = 0; i + 4 <= buf.size(); i += 4) {
          const std::uint64_t r = rng();
          std::memcpy(&buf[i], &r, sizeof r);
        }
      } else if (content == WeightsContent::kMixed) {
        // fp16-like: shared exponents, low-entropy mantissas (tests/support's generator).
        for (auto& v : buf) {
          const std::uint64_t r = rng();
          v = static_cast<std::uint16_t>(0x3c00 | (r & 0x8000) | ((r >> 32) & 0x3f));
        }
      } else {
        for (auto& v : buf) {
          const std::uint64_t r = rng();
          v = static_cast<std::uint16_t>((r & 0x80ff) | ((0x3c + (r >> 60)) << 7));
        }
      }
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(buf.size() * 2, size - done));
      if (::write(fd.get(), buf.data(), n) != static_cast<ssize_t>(n)) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw_syserr(Errc::kIo, err, "write ", tmp);
      }
      done += n;
    }
    if (::fsync(fd.get()) != 0) throw_errno(Errc::kIo, "fsync ", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw_errno(Errc::kIo, "rename ", path);
}

Model::Model(const std::filesystem::path& weights, std::size_t kv_per_request, std::size_t kv_max)
    : kv_(kv_max), kv_per_request_(kv_per_request) {
  if (!weights.empty()) {
    UniqueFd fd(::open(weights.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw_errno(Errc::kInvalidInput, "open weights ", weights);
    const off_t size = ::lseek(fd.get(), 0, SEEK_END);
    if (size < 0) throw_errno(Errc::kIo, "size of ", weights);
    weights_size_ = static_cast<std::size_t>(size);
    // Copied into anonymous memory (not mmap()ed from the file): the weights are then process
    // state that a checkpoint must carry, as a serving runtime's host copies are.
    weights_ = AnonMemory(weights_size_);
    for (std::size_t off = 0; off < weights_size_;) {
      const ssize_t n =
          ::pread(fd.get(), weights_.data() + off,
                  std::min<std::size_t>(weights_size_ - off, 64u << 20), static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw_errno(Errc::kIo, "read weights ", weights);
      off += static_cast<std::size_t>(n);
    }
  }
  weights_hash_ = weights_hash();
  session_ = weights_hash_;
}

std::uint64_t Model::weights_hash() const {
  return weights_size_ ? XXH3_64bits(weights_.data(), weights_size_) : 0;
}

Model::Reply Model::generate(std::string_view prompt) {
  if (kv_used_ + kv_per_request_ > kv_.size())
    throw Error(Errc::kInvalidInput, "KV cache full (" + std::to_string(kv_.size()) + " bytes)");
  session_ = XXH3_64bits_withSeed(prompt.data(), prompt.size(), session_);
  // The new KV block depends on the session so far and on a weights sample.
  std::uint64_t x = session_ ^ (weights_size_ ? weights_.data()[session_ % weights_size_] : 0);
  auto* out = kv_.data() + kv_used_;
  for (std::size_t i = 0; i < kv_per_request_; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const std::size_t n = std::min<std::size_t>(8, kv_per_request_ - i);
    std::memcpy(out + i, &x, n);
  }
  kv_used_ += kv_per_request_;
  ++requests_;
  return state();
}

Model::Reply Model::state() const {
  return {requests_, XXH3_64bits_withSeed(kv_.data(), kv_used_, session_), kv_used_};
}

}  // namespace gpuckpt::demo
