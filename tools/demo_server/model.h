// The demo server's "model": weights in anonymous memory and a growing KV-cache-like session
// buffer. Everything a reply says is derived from both, so a restored process that lost any
// byte of either answers differently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace gpuckpt::demo {

// Anonymous, private memory (what CRIU dumps as process pages), unmapped on destruction.
class AnonMemory {
 public:
  AnonMemory() = default;
  explicit AnonMemory(std::size_t bytes);  // reserved, not touched (MAP_NORESERVE)
  AnonMemory(AnonMemory&&) noexcept;
  AnonMemory& operator=(AnonMemory&&) noexcept;
  ~AnonMemory();
  std::uint8_t* data() const { return static_cast<std::uint8_t*>(p_); }
  std::size_t size() const { return size_; }

 private:
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

// What a generated weights file holds.
enum class WeightsContent {
  kBf16,   // bf16-like tensors: compresses a little (the default)
  kMixed,  // half incompressible random bytes, then half fp16-like values (compressible, like
           // a KV cache): the realistic mix gpuckpt's benchmarks use
};

// Deterministic weights file of `size` bytes (written atomically).
void generate_weights(const std::filesystem::path& path, std::uint64_t size,
                      WeightsContent content = WeightsContent::kBf16);

class Model {
 public:
  // Reads the weights file (empty path: no weights) into anonymous memory; hashes it.
  Model(const std::filesystem::path& weights, std::size_t kv_per_request, std::size_t kv_max);

  struct Reply {
    std::uint64_t requests;
    std::uint64_t hash;  // over the session state and the whole KV buffer
    std::uint64_t kv_bytes;
  };
  // Appends KV state derived from `prompt` and everything before it.
  Reply generate(std::string_view prompt);
  // The same digest without changing anything (reads the whole KV buffer).
  Reply state() const;
  // Re-hashes the weights in memory (proves they survived a restore).
  std::uint64_t weights_hash() const;
  std::uint64_t weights_bytes() const { return weights_size_; }

 private:
  AnonMemory weights_;
  std::size_t weights_size_ = 0;
  std::uint64_t weights_hash_ = 0;
  AnonMemory kv_;
  std::size_t kv_used_ = 0;
  std::size_t kv_per_request_;
  std::uint64_t session_ = 0;  // rolling hash of every prompt so far
  std::uint64_t requests_ = 0;
};

}  // namespace gpuckpt::demo
