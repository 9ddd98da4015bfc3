// The defaults of the network components' bounds, defined once: the
// component Options (HttpServerOptions, TcpStoreLimits) and the config
// sections that set them (common/config/daemon_config.h: [server], [store])
// both initialise from these, so a component built without a config and a
// daemon built from a default config get the same bounds. common/net sits
// below common/config (docs/architecture.md "The dependency rule"), so the
// constants live here and the config references them.
//
// Units as named; thread-safety: constants.
#pragma once

#include <cstdint>

namespace tessera {

// HTTP server (HttpServerOptions; [server]).
inline constexpr double kDefaultHttpReadTimeoutSeconds = 30.0;  // whole request / idle keep-alive
inline constexpr int64_t kDefaultHttpMaxBodyBytes = 4 << 20;    // 413 beyond
inline constexpr int kDefaultHttpMaxConnections = 512;          // 503 beyond
inline constexpr int kDefaultHttpMaxHeaderCount = 100;          // 431 beyond

// Rendezvous store (TcpStoreLimits; [store]).
inline constexpr int64_t kDefaultStoreMaxFrameBytes = 1 << 20;
inline constexpr int kDefaultStoreMaxConnections = 512;
inline constexpr int64_t kDefaultStoreMaxKeys = 65536;
inline constexpr int64_t kDefaultStoreMaxBytes = 64 << 20;
inline constexpr double kDefaultStoreHandshakeTimeoutSeconds = 5.0;

}  // namespace tessera
