// Public trust API (gpuckpt/image.h): ownership checks of a checkpoint before it is restored,
// the signature policy, key generation, and the site configuration.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "image/manifest.h"
#include "remote/remote_checkpoint.h"
#include "trust/keys.h"
#include "trust/secure_file.h"

namespace fs = std::filesystem;

namespace gpuckpt {

namespace {

constexpr const char* kDefaultConfig = "/etc/gpuckpt/config.json";
constexpr const char* kDefaultTrustedKeys = "/etc/gpuckpt/trusted-keys";

[[noreturn]] void untrusted(const fs::path& ckpt, const fs::path& what, const std::string& why) {
  throw Error(Errc::kInvalidInput,
              "refusing to trust checkpoint " + ckpt.string() + ": " + what.string() + " " + why +
                  ". A restore runs what the checkpoint holds, so it must be owned by root (or "
                  "you) and writable by its owner only, in directories nobody else may change; "
                  "fix that, or pass --allow-untrusted");
}

void check_owner_and_modes(const fs::path& ckpt) {
  if (auto u = trust::untrusted_path(ckpt)) untrusted(ckpt, u->path, u->why);
  const image::Manifest m = image::load_manifest(ckpt);
  std::vector<std::string> files{image::kManifestName};
  if (m.sealed) files.push_back(image::kSealName);
  for (const auto& b : m.blobs) files.push_back(b.name);
  for (const auto& name : files) {
    const fs::path p = ckpt / name;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) throw_errno(Errc::kCorrupt, "stat ", p);
    if (!S_ISREG(st.st_mode)) untrusted(ckpt, p, "is not a regular file");
    if (auto why = trust::untrusted_because(st); !why.empty()) untrusted(ckpt, p, why);
  }
}

}  // namespace

const char* signature_state_name(SignatureState s) {
  switch (s) {
    case SignatureState::kUnsigned:
      return "unsigned";
    case SignatureState::kValid:
      return "valid";
    case SignatureState::kInvalid:
      return "invalid";
  }
  return "?";
}

SignatureInfo signature_status(const fs::path& checkpoint, const fs::path& trusted_keys) {
  if (remote::is_s3_url(checkpoint.string())) {
    const remote::LocalView view(checkpoint.string(), remote::LocalView::Fetch::kManifest);
    return signature_status(view.path(), trusted_keys);
  }
  SignatureInfo sig = image::load_manifest(checkpoint).signature;
  if (sig.state != SignatureState::kValid || trusted_keys.empty()) return sig;
  for (const auto& k : trust::load_trusted_keys(trusted_keys)) {
    if (trust::to_base64(k.key.data(), k.key.size()) == sig.public_key) {
      sig.trusted_by = k.file;
      break;
    }
  }
  return sig;
}

void enforce_signature(const SignatureInfo& sig, const TrustOptions& opts,
                       const fs::path& checkpoint) {
  const std::string ckpt = "checkpoint " + checkpoint.string();
  if (sig.state == SignatureState::kInvalid)
    throw Error(Errc::kCorrupt, ckpt + ": invalid signature (key " +
                                    (sig.key_id.empty() ? "?" : sig.key_id) + "): " + sig.problem);
  if (!opts.require_signature) {
    if (sig.state == SignatureState::kValid && !sig.trusted() && !opts.trusted_keys.empty())
      spdlog::warn("{} is signed by key {}, which is not among the trusted keys in {}", ckpt,
                   sig.key_id, opts.trusted_keys.string());
    return;
  }
  if (opts.trusted_keys.empty())
    throw Error(Errc::kInvalidInput,
                ckpt +
                    ": a signature is required but no trusted keys are configured (pass "
                    "--trusted-keys, or set trusted_keys in the gpuckpt config)");
  if (sig.state == SignatureState::kUnsigned)
    throw Error(Errc::kInvalidInput, ckpt + " is not signed, and a signature is required");
  if (!sig.trusted())
    throw Error(Errc::kInvalidInput, ckpt + " is signed by key " + sig.key_id +
                                         ", which is not among the trusted keys in " +
                                         opts.trusted_keys.string());
}

void check_trust(const fs::path& checkpoint, const TrustOptions& opts) {
  if (!opts.allow_untrusted) check_owner_and_modes(checkpoint);
  enforce_signature(signature_status(checkpoint, opts.trusted_keys), opts, checkpoint);
}

KeyPairInfo generate_signing_key(const fs::path& secret_key, const std::string& comment,
                                 bool force) {
  if (secret_key.empty()) throw Error(Errc::kUsage, "no key path given");
  const trust::PublicKey pk = trust::write_key_pair(secret_key, comment, force);
  return {secret_key, secret_key.string() + ".pub", trust::key_id(pk)};
}

SecurityConfig load_security_config() {
  SecurityConfig c;
  const char* env = std::getenv("GPUCKPT_CONFIG");
  const fs::path file = env && *env ? fs::path(env) : fs::path(kDefaultConfig);
  const std::string what = "gpuckpt config " + file.string();
  struct stat st {};
  const auto text = trust::read_regular_file(file, what, {1 << 20, Errc::kInvalidInput, true}, &st);
  if (!text && env && *env) throw Error(Errc::kInvalidInput, what + " does not exist");
  if (text) {
    // The config decides which keys are trusted: only root (or we) may have written it.
    if (auto why = trust::untrusted_because(st); !why.empty())
      throw Error(Errc::kInvalidInput, what + " " + why + "; refusing to use it");
    if (auto u = trust::untrusted_path(file))
      throw Error(Errc::kInvalidInput,
                  what + ": " + u->path.string() + " " + u->why + "; refusing to use it");
    const auto j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_object()) throw Error(Errc::kInvalidInput, what + " is not a JSON object");
    const fs::path base = file.parent_path();
    for (const auto& [k, v] : j.items()) {
      if (k == "require_signature") {
        if (!v.is_boolean())
          throw Error(Errc::kInvalidInput, what + ": 'require_signature' must be true or false");
        c.require_signature = v.get<bool>();
      } else if (k == "sign_key" || k == "trusted_keys") {
        if (!v.is_string() || v.get<std::string>().empty())
          throw Error(Errc::kInvalidInput, what + ": '" + k + "' must be a path");
        (k == "sign_key" ? c.sign_key : c.trusted_keys) = base / v.get<std::string>();
      } else {
        // A misspelt security setting must not be silently ignored.
        throw Error(Errc::kInvalidInput,
                    what + ": unknown setting '" + k +
                        "' (known: sign_key, trusted_keys, require_signature)");
      }
    }
    c.file = file;
  }
  std::error_code ec;
  if (c.trusted_keys.empty() && fs::exists(kDefaultTrustedKeys, ec))
    c.trusted_keys = kDefaultTrustedKeys;
  return c;
}

}  // namespace gpuckpt
