#include "trust/keys.h"

#include <fcntl.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

#include "gpuckpt/error.h"
#include "gpuckpt/support.h"
#include "trust/secure_file.h"
#include "util/fs.h"
#include "util/unique_fd.h"
#include "util/write_fully.h"

namespace fs = std::filesystem;

namespace gpuckpt::trust {

namespace {

constexpr const char* kSecretTag = "gpuckpt-ed25519-secret";
constexpr const char* kPublicTag = "gpuckpt-ed25519";

void init_sodium() {
  // Thread-safe and idempotent; fails only when the system has no entropy source at all.
  if (::sodium_init() < 0) throw Error(Errc::kInternal, "libsodium failed to initialise");
}

std::vector<std::string_view> split_ws(std::string_view line, std::size_t max_fields) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i == line.size()) break;
    if (out.size() + 1 == max_fields) {  // the rest, trailing blanks trimmed
      std::size_t end = line.size();
      while (end > i && std::isspace(static_cast<unsigned char>(line[end - 1]))) --end;
      out.push_back(line.substr(i, end - i));
      break;
    }
    std::size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
    out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

// Creates `path` with `mode` whatever the umask; with `replace`, via a temporary name and
// rename so that an existing key is never half-overwritten.
void write_key_file(const fs::path& path, const std::string& text, mode_t mode, bool replace) {
  const fs::path target = replace ? temp_sibling(path) : path;
  UniqueFd fd(::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd) {
    if (errno == EEXIST)
      throw Error(Errc::kExists, path.string() + " already exists (use --force to replace it)");
    throw_errno(Errc::kIo, "create ", target);
  }
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::unlink(target.c_str());
    throw_syserr(Errc::kIo, err, what, " ", target);
  };
  if (::fchmod(fd.get(), mode) != 0) fail("chmod");
  if (const int err = write_fully(fd.get(), text.data(), text.size())) {
    errno = err;  // fail() reports errno
    fail("write");
  }
  if (::fsync(fd.get()) != 0) fail("fsync");
  if (replace && ::rename(target.c_str(), path.c_str()) != 0) fail("rename to " + path.string());
}

}  // namespace

std::string key_id(const PublicKey& pk) {
  init_sodium();
  unsigned char h[crypto_generichash_BYTES];
  crypto_generichash(h, sizeof h, pk.data(), pk.size(), nullptr, 0);
  static const char* digits = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 8; ++i) {
    id += digits[h[i] >> 4];
    id += digits[h[i] & 15];
  }
  return id;
}

std::string to_base64(const unsigned char* data, std::size_t len) {
  init_sodium();
  const int variant = sodium_base64_VARIANT_ORIGINAL;
  std::string out(sodium_base64_ENCODED_LEN(len, variant), '\0');
  sodium_bin2base64(out.data(), out.size(), data, len, variant);
  out.resize(out.size() - 1);  // the terminating NUL
  return out;
}

std::optional<std::vector<unsigned char>> from_base64(std::string_view text, std::size_t len) {
  // Nothing to decode: libsodium would be handed null buffers, which it declares it never takes.
  if (text.empty() || len == 0)
    return text.empty() && len == 0 ? std::optional(std::vector<unsigned char>()) : std::nullopt;
  init_sodium();
  std::vector<unsigned char> out(len);
  std::size_t got = 0;
  const char* end = nullptr;
  if (sodium_base642bin(out.data(), out.size(), text.data(), text.size(), nullptr, &got, &end,
                        sodium_base64_VARIANT_ORIGINAL) != 0 ||
      got != len || end != text.data() + text.size())
    return std::nullopt;
  return out;
}

bool verify(const PublicKey& pk, const Signature& sig, std::string_view message) {
  init_sodium();
  return crypto_sign_verify_detached(sig.data(),
                                     reinterpret_cast<const unsigned char*>(message.data()),
                                     message.size(), pk.data()) == 0;
}

SigningKey SigningKey::load(const fs::path& path) {
  init_sodium();
  const std::string what = "signing key " + path.string();
  struct stat st {};
  auto text = read_regular_file(path, what, {4096, Errc::kInvalidInput, true}, &st);
  if (!text) throw Error(Errc::kInvalidInput, what + " does not exist");
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    throw Error(Errc::kInvalidInput, what + " " + untrusted_because(st));
  if ((st.st_mode & 077) != 0)
    throw Error(Errc::kInvalidInput, what + " is accessible by group or others (mode " +
                                         format_mode(st.st_mode) + "); chmod 600 it");
  SigningKey k;
  const auto fields = split_ws(*text, 3);
  std::optional<std::vector<unsigned char>> sk;
  if (fields.size() == 2 && fields[0] == kSecretTag) sk = from_base64(fields[1], k.sk_.size());
  sodium_memzero(text->data(), text->size());
  if (!sk)
    throw Error(Errc::kInvalidInput,
                what + " is not a gpuckpt secret key (write one with `gpuckpt keygen`)");
  std::copy(sk->begin(), sk->end(), k.sk_.begin());
  sodium_memzero(sk->data(), sk->size());
  crypto_sign_ed25519_sk_to_pk(k.pk_.data(), k.sk_.data());
  return k;
}

SigningKey::SigningKey(SigningKey&& o) noexcept : sk_(o.sk_), pk_(o.pk_) {
  sodium_memzero(o.sk_.data(), o.sk_.size());
}

SigningKey::~SigningKey() {
  sodium_memzero(sk_.data(), sk_.size());
}

Signature SigningKey::sign(std::string_view message) const {
  Signature sig{};
  crypto_sign_detached(sig.data(), nullptr, reinterpret_cast<const unsigned char*>(message.data()),
                       message.size(), sk_.data());
  return sig;
}

namespace {

void require_trusted(const fs::path& path, const std::string& what) {
  if (auto u = untrusted_path(path))
    throw Error(Errc::kInvalidInput, what + ": " + u->path.string() + " " + u->why +
                                         "; trusted keys must be changeable only by root");
}

void parse_key_lines(const fs::path& file, const std::string& text, std::vector<TrustedKey>& out) {
  std::size_t start = 0, lineno = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++lineno;
    const auto f = split_ws(line, 3);
    if (f.empty() || f[0].front() == '#') continue;
    std::optional<std::vector<unsigned char>> pk;
    if (f.size() >= 2 && f[0] == kPublicTag) pk = from_base64(f[1], 32);
    if (!pk)
      throw Error(Errc::kInvalidInput,
                  "trusted key file " + file.string() + " line " + std::to_string(lineno) +
                      " is not a gpuckpt public key (\"" + kPublicTag + " BASE64 [comment]\")");
    TrustedKey k;
    std::copy(pk->begin(), pk->end(), k.key.begin());
    k.file = file;
    if (f.size() == 3) k.comment = f[2];
    out.push_back(std::move(k));
  }
}

}  // namespace

std::vector<TrustedKey> load_trusted_keys(const fs::path& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st))
    throw Error(Errc::kInvalidInput, "trusted keys " + path.string() + " do not exist");
  std::vector<fs::path> files;
  if (fs::is_directory(st)) {
    for (auto it = fs::directory_iterator(path, ec); !ec && it != fs::end(it); it.increment(ec))
      if (it->path().extension() == ".pub") files.push_back(it->path());
    if (ec) throw Error(Errc::kInvalidInput, "cannot list " + path.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  require_trusted(path, "trusted keys " + path.string());
  std::vector<TrustedKey> keys;
  for (const auto& f : files) {
    const std::string what = "trusted key file " + f.string();
    struct stat fst {};
    auto text = read_regular_file(f, what, {1 << 20, Errc::kInvalidInput, true}, &fst);
    if (!text) throw Error(Errc::kInvalidInput, what + " does not exist");
    if (auto why = untrusted_because(fst); !why.empty())
      throw Error(Errc::kInvalidInput,
                  what + " " + why + "; trusted keys must be changeable only by root");
    if (f != path) require_trusted(f, what);  // a symlink in the directory points elsewhere
    parse_key_lines(f, *text, keys);
  }
  return keys;
}

PublicKey write_key_pair(const fs::path& secret, const std::string& comment, bool force) {
  init_sodium();
  const fs::path pub = secret.string() + ".pub";
  std::error_code ec;
  if (!force) {
    for (const auto& p : {secret, pub})
      if (fs::exists(fs::symlink_status(p, ec)))
        throw Error(Errc::kExists, p.string() + " already exists (use --force to replace it)");
  }
  const fs::path dir = secret.parent_path().empty() ? fs::path(".") : secret.parent_path();
  if (!fs::is_directory(dir, ec))
    throw Error(Errc::kInvalidInput, "directory " + dir.string() + " does not exist");
  if (comment.find_first_of("\n\r") != std::string::npos)
    throw Error(Errc::kUsage, "a key comment must be a single line");
  PublicKey pk{};
  std::array<unsigned char, 64> sk{};
  crypto_sign_keypair(pk.data(), sk.data());
  std::string text = std::string(kSecretTag) + " " + to_base64(sk.data(), sk.size()) + "\n";
  sodium_memzero(sk.data(), sk.size());
  try {
    write_key_file(secret, text, 0600, force);
  } catch (...) {
    sodium_memzero(text.data(), text.size());
    throw;
  }
  sodium_memzero(text.data(), text.size());
  std::string line = std::string(kPublicTag) + " " + to_base64(pk.data(), pk.size());
  if (!comment.empty()) line += " " + comment;
  write_key_file(pub, line + "\n", 0644, force);
  fsync_dir(dir);
  return pk;
}

}  // namespace gpuckpt::trust
