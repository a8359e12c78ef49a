// `gpuckpt keygen`: an ed25519 key pair that signs checkpoints (docs/OPERATORS.md).
#include <cstdio>
#include <memory>

#include "commands.h"

namespace gpuckpt::cli {

namespace {

std::string default_comment() {
  const std::string host = host_name();
  return host.empty() ? "gpuckpt" : "gpuckpt@" + host;
}

}  // namespace

void add_keygen_command(CLI::App& app, Context& ctx) {
  struct Args {
    std::string output, comment;
    bool force = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "keygen", "Create an ed25519 key pair for signing checkpoints: KEY (secret) and KEY.pub");
  cmd->add_option("-o,--output", a->output,
                  "Secret key file to create, e.g. /etc/gpuckpt/node.key (mode 0600); the "
                  "public key goes to FILE.pub")
      ->required();
  cmd->add_option("--comment", a->comment, "Stored with the public key (default: gpuckpt@HOST)");
  cmd->add_flag("--force", a->force, "Replace existing key files");
  cmd->callback([&ctx, a] {
    const KeyPairInfo k = generate_signing_key(
        a->output, a->comment.empty() ? default_comment() : a->comment, a->force);
    if (ctx.json) {
      ctx.emit({{"ok", true},
                {"command", "keygen"},
                {"secret_key", k.secret_key.string()},
                {"public_key", k.public_key.string()},
                {"key_id", k.key_id}});
      return;
    }
    std::printf("secret key %s (keep it on this host, mode 0600)\n", k.secret_key.c_str());
    std::printf("public key %s, key id %s\n", k.public_key.c_str(), k.key_id.c_str());
    std::printf(
        "sign with --sign-key %s (or \"sign_key\" in the gpuckpt config); copy %s into "
        "the trusted keys of the hosts that restore\n",
        k.secret_key.c_str(), k.public_key.c_str());
  });
}

}  // namespace gpuckpt::cli
