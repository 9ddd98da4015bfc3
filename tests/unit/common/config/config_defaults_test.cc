// The config structs (common/config/daemon_config.h) are the one home of
// defaults: every component Options a config key sets starts from the same
// value, so a component built without a config (the CLI's engine, the
// worker's metrics server, a test's store) behaves as a daemon built from a
// default config. The Options initialise from the config sections (or, below
// common/config, from common/net/net_defaults.h, which the config uses too);
// this checks each pair.
#include <gtest/gtest.h>

#include "common/config/daemon_config.h"
#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "common/net/http_server.h"
#include "common/net/tcp_store_server_core.h"
#include "coordinator/control/control_server.h"

namespace tessera {
namespace {

TEST(ConfigDefaults, HttpServerOptionsMatchTheServerSection) {
  const ServerSection server;
  const HttpServerOptions http;
  EXPECT_EQ(http.max_connections, server.max_connections);
  EXPECT_EQ(http.max_connections, 512);
  EXPECT_EQ(http.read_timeout_seconds, server.read_timeout_seconds);
  EXPECT_EQ(static_cast<int64_t>(http.max_body_bytes), server.max_body_bytes);
  EXPECT_EQ(static_cast<int>(http.max_header_count), server.max_header_count);
}

TEST(ConfigDefaults, StoreLimitsMatchTheStoreSection) {
  const StoreSection store;
  const TcpStoreLimits limits;
  EXPECT_EQ(limits.max_frame_bytes, store.max_frame_bytes);
  EXPECT_EQ(limits.max_connections, store.max_connections);
  EXPECT_EQ(limits.max_keys, store.max_keys);
  EXPECT_EQ(limits.max_bytes, store.max_bytes);
  EXPECT_EQ(limits.handshake_timeout_seconds, store.handshake_timeout_seconds);
}

TEST(ConfigDefaults, SchedulerAndEngineOptionsMatchTheSchedulerSection) {
  const SchedulerSection section;
  const SchedulerOptions scheduler;
  EXPECT_EQ(scheduler.max_batch_tokens, section.max_batch_tokens);
  EXPECT_EQ(scheduler.max_sequences, section.max_sequences);
  EXPECT_EQ(scheduler.queue_limit, section.queue_limit);
  EXPECT_EQ(scheduler.prefill_chunk_tokens, section.prefill_chunk_tokens);
  EXPECT_EQ(scheduler.prefill_chunk_budget, section.prefill_chunk_budget);
  EXPECT_EQ(section.prefill_chunk_budget, PrefillChunkBudget::kTokens);
  const EngineOptions engine;
  EXPECT_EQ(engine.prefill_chunk_budget, section.prefill_chunk_budget);
  EXPECT_EQ(engine.max_batch_tokens, section.max_batch_tokens);
  EXPECT_EQ(engine.prefill_chunk_tokens, section.prefill_chunk_tokens);
  EXPECT_EQ(engine.prefill_chunk_tokens, 512);
}

TEST(ConfigDefaults, ControlServerOptionsMatchTheConfig) {
  const ControlServerOptions control;
  EXPECT_EQ(control.max_workers, static_cast<size_t>(ServerSection{}.max_workers));
  EXPECT_EQ(control.heartbeat_interval.count(),
            static_cast<int64_t>(HeartbeatSection{}.interval_seconds * 1000));
}

}  // namespace
}  // namespace tessera
