// ed25519 keys (libsodium) for signing checkpoint manifests. Key files are one text line:
//   secret: "gpuckpt-ed25519-secret <base64 of the 64-byte libsodium secret key>"
//   public: "gpuckpt-ed25519 <base64 of the 32-byte public key> [comment]"
// A trusted-keys file may hold several public key lines ('#' starts a comment line).
#pragma once

#include <array>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuckpt::trust {

using PublicKey = std::array<unsigned char, 32>;
using Signature = std::array<unsigned char, 64>;

inline constexpr const char* kAlgorithm = "ed25519";

// 16 hex digits naming a key: the first 8 bytes of BLAKE2b-256 of the public key.
std::string key_id(const PublicKey& pk);
std::string to_base64(const unsigned char* data, std::size_t len);
// Decodes standard base64 of exactly `len` bytes; nullopt otherwise.
std::optional<std::vector<unsigned char>> from_base64(std::string_view text, std::size_t len);

bool verify(const PublicKey& pk, const Signature& sig, std::string_view message);

// A secret key in memory, wiped when destroyed.
class SigningKey {
 public:
  // The file must be a regular file owned by root or the effective uid, readable by nobody
  // else (like an ssh private key); Error(kInvalidInput) otherwise.
  static SigningKey load(const std::filesystem::path& path);
  SigningKey(const SigningKey&) = delete;
  SigningKey& operator=(const SigningKey&) = delete;
  SigningKey(SigningKey&& o) noexcept;
  SigningKey& operator=(SigningKey&&) = delete;
  ~SigningKey();

  const PublicKey& public_key() const { return pk_; }
  Signature sign(std::string_view message) const;

 private:
  SigningKey() = default;
  std::array<unsigned char, 64> sk_{};
  PublicKey pk_{};
};

struct TrustedKey {
  PublicKey key;
  std::filesystem::path file;
  std::string comment;
};

// Reads a public key file, or every *.pub file of a directory. The file(s), the directory and
// the directories above must be trusted (root or ours, not writable by others): these keys
// decide what runs as root. Error(kInvalidInput) for a missing path or a bad line.
std::vector<TrustedKey> load_trusted_keys(const std::filesystem::path& path);

// Writes a new key pair: `secret` (0600) and `secret`.pub (0644), replacing existing files
// only with `force`. Returns the public key.
PublicKey write_key_pair(const std::filesystem::path& secret, const std::string& comment,
                         bool force);

}  // namespace gpuckpt::trust
