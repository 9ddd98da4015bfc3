// `tessera keygen --out BASE`: makes a CURVE key pair for the control plane
// (common/net/curve_keys.h): BASE.key holds the secret key (mode 0600, stays on
// its host), BASE.pub the public key, which is also printed. Existing files
// are never overwritten.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "common/net/curve_keys.h"

namespace tessera::cli {

Subcommand AddKeygenCommand(CLI::App& app) {
  auto out = std::make_shared<std::string>();
  Subcommand s;
  s.app = app.add_subcommand(
      "keygen",
      "make a CURVE key pair for the control plane: BASE.key (secret) and BASE.pub (public)");
  s.app->add_option("--out", *out, "path without extension, e.g. keys/worker0")->required();
  s.run = [out]() -> int {
    StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
    if (!pair.ok()) {
      std::fprintf(stderr, "tessera keygen: %s\n", pair.status().ToString().c_str());
      return 1;
    }
    if (Status st = WriteCurveKeyPair(*pair, *out); !st.ok()) {
      std::fprintf(stderr, "tessera keygen: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("secret key: %s.key (keep it on this host, mode 0600)\n", out->c_str());
    std::printf("public key: %s.pub\n%s\n", out->c_str(), pair->public_key.c_str());
    return 0;
  };
  return s;
}

}  // namespace tessera::cli
