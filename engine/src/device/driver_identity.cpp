// A driver build's identity for the process record (device/cuda_driver.h). Apart from
// cuda_driver.cpp, which criu's plugin also links: the plugin carries no libsodium.
#include <sodium.h>

#include <fstream>
#include <string>
#include <vector>

#include "device/cuda_driver.h"

namespace gpuckpt::device {

namespace {

// A file's SHA-256 in hex; "" if it cannot be read.
std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in || sodium_init() < 0) return {};
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crypto_hash_sha256_update(&st, reinterpret_cast<const unsigned char*>(buf.data()),
                              static_cast<unsigned long long>(in.gcount()));
  }
  if (in.bad()) return {};
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256_final(&st, digest);
  char hex[2 * crypto_hash_sha256_BYTES + 1];
  sodium_bin2hex(hex, sizeof hex, digest, sizeof digest);
  return hex;
}

}  // namespace

DriverIdentity driver_identity() {
  DriverIdentity id;
  id.module_version = kernel_module_version();
  id.library = driver_library_path();
  if (!id.library.empty()) id.library_sha256 = file_sha256(id.library);
  return id;
}

std::string driver_mismatch(const DriverIdentity& dumped, const DriverIdentity& here) {
  auto side = [](const DriverIdentity& d) {
    return "driver " + (d.module_version.empty() ? std::string("?") : d.module_version) + " with " +
           (d.library.empty() ? std::string("libcuda") : d.library) +
           (d.library_sha256.empty() ? "" : " (SHA-256 " + d.library_sha256.substr(0, 16) + "...)");
  };
  const bool module_differs = !dumped.module_version.empty() && !here.module_version.empty() &&
                              dumped.module_version != here.module_version;
  const bool library_differs = !dumped.library_sha256.empty() && !here.library_sha256.empty() &&
                               dumped.library_sha256 != here.library_sha256;
  if (!module_differs && !library_differs) return {};
  return "the checkpoint's CUDA state was made under " + side(dumped) + ", but this host has " +
         side(here) + (module_differs ? "" : " (the same version, another build)") +
         ": the driver restores only its own build's checkpoints";
}

}  // namespace gpuckpt::device
