// ValidateDaemonConfig (common/config/daemon_config.h): every range,
// relation and security rule of the config, each failure naming the key to
// blame and where it was set.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "common/config/daemon_config_internal.h"
#include "common/net/curve_keys.h"
#include "common/net/endpoint.h"
#include "common/net/host_address.h"

namespace tessera {

namespace {
// Input bounds of [parallel]: a tp or pp, and the ranks of a layout.
constexpr int kMaxLayoutDegree = 1 << 16;
constexpr int64_t kMaxLayoutRanks = 1 << 20;
}  // namespace

namespace config_internal {

// ---------------------------------------------------------------------------
// Validation helpers.

// Parsed, and names resolved: common/net/host_address.h.
bool IsLoopback(const std::string& host) { return IsLoopbackHost(host); }

// common/net/endpoint.h: the one endpoint parser and host syntax.
bool IsWildcard(const std::string& host) { return IsWildcardHost(host); }

bool IsHost(const std::string& host) { return IsHostSyntax(host); }

// "" when `endpoint` parses for `use` (into *host, brackets removed, and
// *port), else what is wrong.
std::string ParseEndpoint(const std::string& endpoint, EndpointUse use, std::string* host,
                          int* port) {
  StatusOr<TcpEndpoint> parsed = ParseTcpEndpoint(endpoint, use);
  if (!parsed.ok()) return parsed.status().message();
  *host = parsed->host;
  *port = parsed->port;
  return "";
}

// RFC 6750 b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
bool IsBearerToken(const std::string& token) {
  size_t i = 0;
  while (i < token.size() && (std::isalnum(static_cast<unsigned char>(token[i])) ||
                              (token[i] != '\0' && std::strchr("-._~+/", token[i]) != nullptr))) {
    ++i;
  }
  if (i == 0) return false;
  while (i < token.size() && token[i] == '=') ++i;
  return i == token.size();
}

// Where `key` was set: its source, else the file, else "(defaults)".
std::string Where(const DaemonConfig& c, const std::string& key) {
  auto it = c.sources.find(key);
  if (it != c.sources.end()) return it->second;
  return c.path.empty() ? "(defaults)" : c.path;
}

bool IsSet(const DaemonConfig& c, const std::string& key) { return c.sources.count(key) > 0; }

Status Bad(const DaemonConfig& c, const std::string& key, const std::string& what) {
  return KeyError(Where(c, key), key, what);
}

// How recently `key` was given: 2 by an override, 1 in the file, 0 default.
int Recency(const DaemonConfig& c, const std::string& key) {
  auto it = c.sources.find(key);
  if (it == c.sources.end()) return 0;
  return it->second.rfind("--set ", 0) == 0 ? 2 : 1;
}

// The layout key a too-large layout is blamed on: the one given last (a
// --set over the file), else the larger of tp and pp.
const char* LayoutKeyToBlame(const DaemonConfig& c) {
  const int tp_recency = Recency(c, "parallel.tp"), pp_recency = Recency(c, "parallel.pp");
  if (tp_recency != pp_recency) return tp_recency > pp_recency ? "parallel.tp" : "parallel.pp";
  int max_tp = c.parallel.tp;
  for (int t : c.parallel.tp_per_stage) max_tp = std::max(max_tp, t);
  return c.parallel.pp >= max_tp ? "parallel.pp" : "parallel.tp";
}

// Of two keys in a relation that fails, the one to blame: the one given last
// (an override over the file over a default); `dependent` on a tie.
std::string Blame(const DaemonConfig& c, const std::string& dependent, const std::string& other) {
  return Recency(c, other) > Recency(c, dependent) ? other : dependent;
}

// The checks of one explicit layout whose keys are `prefix`.tp, .pp and
// .layers_per_stage ("parallel", or "parallel.replica_override[i]");
// `ranks_key` is blamed for a layout of too many ranks.
Status CheckLayoutKeys(const DaemonConfig& c, const std::string& prefix, const LayoutSection& l,
                       const std::string& ranks_key) {
  const std::string tp_key = prefix + ".tp", pp_key = prefix + ".pp",
                    layers_key = prefix + ".layers_per_stage";
  if (l.tp_per_stage.empty() && l.tp < 1)
    return Bad(c, tp_key, fmt::format("must be >= 1, got {}", l.tp));
  if (l.pp < 1) return Bad(c, pp_key, fmt::format("must be >= 1, got {}", l.pp));
  // Bounds on the input, far above any real layout, so that worker counts
  // fit an int (tp = pp = 65536 once wrapped to 0 workers).
  if (l.tp_per_stage.empty() && l.tp > kMaxLayoutDegree)
    return Bad(c, tp_key, fmt::format("must be at most {}, got {}", kMaxLayoutDegree, l.tp));
  if (l.pp > kMaxLayoutDegree)
    return Bad(c, pp_key, fmt::format("must be at most {}, got {}", kMaxLayoutDegree, l.pp));
  const auto& tps = l.tp_per_stage;
  if (!tps.empty()) {
    if (static_cast<int>(tps.size()) != l.pp) {
      return Bad(c, tp_key,
                 fmt::format("must have one entry per stage ({} = {}), got {} entries [{}]", pp_key,
                             l.pp, tps.size(), fmt::join(tps, ", ")));
    }
    for (size_t i = 0; i < tps.size(); ++i) {
      if (tps[i] < 1) {
        return Bad(c, tp_key,
                   fmt::format("entry {} (stage {}) must be >= 1, got {}", i, i, tps[i]));
      }
      if (tps[i] > kMaxLayoutDegree) {
        return Bad(c, tp_key,
                   fmt::format("entry {} (stage {}) must be at most {}, got {}", i, i,
                               kMaxLayoutDegree, tps[i]));
      }
    }
  }
  int64_t ranks = 0;
  for (int s = 0; s < l.pp; ++s) ranks += l.TpOfStage(s);
  if (ranks > kMaxLayoutRanks) {
    return Bad(c, ranks_key,
               fmt::format("the layout has {} ranks (the sum of every stage's tp); at most {}",
                           ranks, kMaxLayoutRanks));
  }
  const auto& layers = l.layers_per_stage;
  if (!layers.empty()) {
    if (static_cast<int>(layers.size()) != l.pp) {
      return Bad(c, layers_key,
                 fmt::format("must have one entry per stage ({} = {}), got {} entries [{}]", pp_key,
                             l.pp, layers.size(), fmt::join(layers, ", ")));
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i] < 1) {
        return Bad(c, layers_key,
                   fmt::format("entry {} (stage {}) must be >= 1, got {}", i, i, layers[i]));
      }
    }
  }
  return Status::Ok();
}

// parallel.replica_override (explicit mode): each entry names a replica
// that exists, once, with a valid layout.
Status CheckReplicaOverrides(const DaemonConfig& c) {
  const ParallelSection& par = c.parallel;
  for (size_t i = 0; i < par.replica_overrides.size(); ++i) {
    const ReplicaOverride& o = par.replica_overrides[i];
    const std::string entry = fmt::format("parallel.replica_override[{}]", i);
    const std::string replica_key = entry + ".replica";
    if (par.replicas == 0)
      return Bad(c, entry,
                 "needs parallel.replicas >= 1: with 0 (as many as fit) no replica index is "
                 "known in advance");
    if (o.replica < 0 || o.replica >= par.replicas)
      return Bad(c, replica_key,
                 fmt::format("must be a replica index in 0..{} (parallel.replicas = {}), got {}",
                             par.replicas - 1, par.replicas, o.replica));
    for (size_t j = 0; j < i; ++j)
      if (par.replica_overrides[j].replica == o.replica)
        return Bad(
            c, replica_key,
            fmt::format("replica {} has an override already: "
                        "parallel.replica_override[{}] (at {}); give one per replica",
                        o.replica, j, Where(c, fmt::format("parallel.replica_override[{}]", j))));
    TESSERA_RETURN_IF_ERROR(CheckLayoutKeys(c, entry, o.layout, entry + ".tp"));
  }
  return Status::Ok();
}

Status CheckHost(const DaemonConfig& c, const std::string& key, const std::string& host) {
  if (!IsHost(host)) return Bad(c, key, "must be a host name or IP address, got " + Quote(host));
  return Status::Ok();
}

Status CheckPort(const DaemonConfig& c, const std::string& key, int port, bool zero_ok) {
  if ((port == 0 && zero_ok) || (port >= 1 && port <= 65535)) return Status::Ok();
  return Bad(c, key, fmt::format("must be in {}..65535, got {}", zero_ok ? 0 : 1, port));
}

// Port 0 is a port the kernel picks at bind time: never one already taken.
bool SameListener(const std::string& host_a, int port_a, const std::string& host_b, int port_b) {
  return port_a != 0 && port_a == port_b &&
         (host_a == host_b || IsWildcard(host_a) || IsWildcard(host_b));
}

}  // namespace config_internal

using namespace config_internal;  // NOLINT: this file is the validation of those helpers' config

Status ValidateDaemonConfig(const DaemonConfig& c) {
  // [model]
  if (c.model.path.empty()) return Bad(c, "model.path", "must name the model directory, got \"\"");

  // [parallel]
  const ParallelSection& par = c.parallel;
  if (par.workers < 0)
    return Bad(c, "parallel.workers", fmt::format("must be >= 0, got {}", par.workers));
  if (par.replicas < 0 || par.replicas > kMaxLayoutRanks)
    return Bad(c, "parallel.replicas",
               fmt::format("must be in [0, {}] (0 = as many as fit), got {}", kMaxLayoutRanks,
                           par.replicas));
  if (par.mode == ParallelMode::kAuto) {
    for (const char* key :
         {"parallel.tp", "parallel.pp", "parallel.layers_per_stage", "parallel.replica_override"}) {
      bool non_default =
          (std::string(key) == "parallel.tp" && (par.tp != 1 || !par.tp_per_stage.empty())) ||
          (std::string(key) == "parallel.pp" && par.pp != 1) ||
          (std::string(key) == "parallel.layers_per_stage" && !par.layers_per_stage.empty()) ||
          (std::string(key) == "parallel.replica_override" && !par.replica_overrides.empty());
      if (IsSet(c, key) || non_default) {
        return Bad(c, key,
                   "is set but parallel.mode = \"auto\" (at " + Where(c, "parallel.mode") +
                       "); remove it, or set parallel.mode = \"explicit\"");
      }
    }
  } else {
    TESSERA_RETURN_IF_ERROR(CheckLayoutKeys(c, "parallel", par.BaseLayout(), LayoutKeyToBlame(c)));
    TESSERA_RETURN_IF_ERROR(CheckReplicaOverrides(c));
    const int64_t all_ranks = par.ReplicasWorldSize();  // every replica's ranks
    const bool overridden = !par.replica_overrides.empty();
    if (par.replicas == 0 && par.workers == 0)
      return Bad(c, "parallel.replicas",
                 "0 (as many replicas as fit) needs parallel.workers in explicit mode: the "
                 "coordinator places workers / (tp * pp) replicas");
    if (par.replicas == 0 && par.workers < par.world_size())
      return Bad(c, "parallel.workers",
                 fmt::format("must be at least the layout's worker count {} (tp * pp), got {}",
                             par.world_size(), par.workers));
    if (par.replicas > 0 && par.workers != 0 && par.workers != all_ranks) {
      if (overridden) {
        std::vector<std::string> terms;
        for (int r = 0; r < par.replicas; ++r)
          terms.push_back(std::to_string(par.LayoutOfReplica(r).world_size()));
        return Bad(c, "parallel.workers",
                   fmt::format("must be 0 or the sum of every replica's worker count (tp * pp, "
                               "parallel.replica_override included) {} = {} in explicit mode, "
                               "got {}",
                               fmt::join(terms, " + "), all_ranks, par.workers));
      }
      return Bad(c, "parallel.workers",
                 fmt::format("must be 0 or parallel.replicas x the layout's worker count {} x {} "
                             "= {} in explicit mode, got {}",
                             par.replicas, par.world_size(), all_ranks, par.workers));
    }
    if (all_ranks > kMaxLayoutRanks)
      return Bad(c, "parallel.replicas",
                 overridden ? fmt::format("{} replicas of {} ranks in all: at most {} workers",
                                          par.replicas, all_ranks, kMaxLayoutRanks)
                            : fmt::format("{} replicas of {} ranks: at most {} workers in all",
                                          par.replicas, par.world_size(), kMaxLayoutRanks));
  }

  // [server]
  const ServerSection& srv = c.server;
  TESSERA_RETURN_IF_ERROR(CheckHost(c, "server.host", srv.host));
  TESSERA_RETURN_IF_ERROR(CheckPort(c, "server.port", srv.port, true));
  std::string control_host;
  int control_port = 0;
  std::string why =
      ParseEndpoint(srv.control_endpoint, EndpointUse::kBind, &control_host, &control_port);
  if (!why.empty()) return Bad(c, "server.control_endpoint", why);
  if (srv.tls_cert.empty() != srv.tls_key.empty()) {
    const char* set = srv.tls_cert.empty() ? "server.tls_key" : "server.tls_cert";
    const char* missing = srv.tls_cert.empty() ? "server.tls_cert" : "server.tls_key";
    return Bad(c, set, std::string("is set but ") + missing + " is not; HTTPS needs both");
  }
  if (!(srv.read_timeout_seconds > 0) || !std::isfinite(srv.read_timeout_seconds)) {
    return Bad(c, "server.read_timeout_seconds",
               "must be a finite number > 0, got " + FormatDouble(srv.read_timeout_seconds));
  }
  if (srv.max_body_bytes < 1) {
    return Bad(c, "server.max_body_bytes", fmt::format("must be >= 1, got {}", srv.max_body_bytes));
  }
  if (srv.max_connections < 1) {
    return Bad(c, "server.max_connections",
               fmt::format("must be >= 1, got {}", srv.max_connections));
  }
  if (srv.max_header_count < 1) {
    return Bad(c, "server.max_header_count",
               fmt::format("must be >= 1, got {}", srv.max_header_count));
  }
  if (srv.max_streams < 1) {
    return Bad(c, "server.max_streams", fmt::format("must be >= 1, got {}", srv.max_streams));
  }
  if (srv.max_prompt_bytes < 1)
    return Bad(c, "server.max_prompt_bytes",
               fmt::format("must be >= 1, got {}", srv.max_prompt_bytes));
  if (srv.request_threads < 0)
    return Bad(c, "server.request_threads",
               fmt::format("must be >= 0 (0 = one per two hardware threads), got {}",
                           srv.request_threads));
  if (srv.max_workers < 1) {
    return Bad(c, "server.max_workers", fmt::format("must be >= 1, got {}", srv.max_workers));
  }

  // [admin]
  const AdminSection& adm = c.admin;
  TESSERA_RETURN_IF_ERROR(CheckPort(c, "admin.port", adm.port, true));
  if (adm.pick_port && IsSet(c, "admin.port")) {
    return Bad(c, Blame(c, "admin.pick_port", "admin.port"),
               "admin.pick_port = true picks the admin listener's port and admin.port is set too; "
               "give one");
  }
  // A separate admin listener: admin.port, or a picked port.
  const bool separate_admin = adm.pick_port || adm.port != 0;
  if (separate_admin) {
    TESSERA_RETURN_IF_ERROR(CheckHost(c, "admin.host", adm.host));
    if (!adm.pick_port && SameListener(adm.host, adm.port, srv.host, srv.port)) {
      return Bad(
          c, Blame(c, "admin.port", "server.port"),
          fmt::format("the admin listener ({}:{}) and the API listener ({}:{}) are on one port; "
                      "use another port, or admin.port = 0 to serve the admin API on the API "
                      "listener",
                      adm.host, adm.port, srv.host, srv.port));
    }
  }
  if (SameListener(control_host, control_port, srv.host, srv.port)) {
    return Bad(c, "server.control_endpoint",
               fmt::format("{} is on the API listener's port ({}:{})", Quote(srv.control_endpoint),
                           srv.host, srv.port));
  }
  if (separate_admin && !adm.pick_port &&
      SameListener(control_host, control_port, adm.host, adm.port)) {
    return Bad(c, "server.control_endpoint",
               fmt::format("{} is on the admin listener's port ({}:{})",
                           Quote(srv.control_endpoint), adm.host, adm.port));
  }
  if (!adm.token.empty() && !adm.token_file.empty()) {
    return Bad(c, Blame(c, "admin.token_file", "admin.token"),
               "admin.token and admin.token_file are both set; give one");
  }
  if (!adm.token.empty() && !IsBearerToken(adm.token)) {
    return Bad(c, "admin.token",
               "must be a bearer token (letters, digits, - . _ ~ + / and trailing =), got " +
                   fmt::format("{} characters including invalid ones", adm.token.size()));
  }
  if (adm.token.empty() && adm.token_file.empty()) {
    const std::string& admin_host = separate_admin ? adm.host : srv.host;
    if (!IsLoopback(admin_host)) {
      const std::string key = separate_admin ? "admin.host" : "server.host";
      return Bad(
          c, key,
          Quote(admin_host) + " exposes the admin API beyond loopback" +
              (!separate_admin ? " (admin.port = 0 serves it on the API listener)" : "") +
              " without a token; set admin.token or admin.token_file, or give the admin API a "
              "loopback address");
    }
  }

  // [store]
  const StoreSection& st = c.store;
  if (st.max_frame_bytes < 4096 || st.max_frame_bytes > (int64_t{1} << 30))
    return Bad(c, "store.max_frame_bytes",
               fmt::format("must be in 4096..1073741824, got {}", st.max_frame_bytes));
  for (auto [key, v] :
       {std::pair<const char*, int64_t>{"store.max_connections", st.max_connections},
        {"store.max_keys", st.max_keys},
        {"store.max_bytes", st.max_bytes}})
    if (v < 1) return Bad(c, key, fmt::format("must be >= 1, got {}", v));
  if (!std::isfinite(st.handshake_timeout_seconds) || !(st.handshake_timeout_seconds > 0))
    return Bad(c, "store.handshake_timeout_seconds",
               "must be a finite number > 0, got " + FormatDouble(st.handshake_timeout_seconds));

  // [heartbeat]
  const HeartbeatSection& hb = c.heartbeat;
  if (!(hb.interval_seconds > 0) || !std::isfinite(hb.interval_seconds)) {
    return Bad(c, "heartbeat.interval_seconds",
               "must be a finite number > 0, got " + FormatDouble(hb.interval_seconds));
  }
  if (!(hb.timeout_seconds > 0) || !std::isfinite(hb.timeout_seconds)) {
    return Bad(c, "heartbeat.timeout_seconds",
               "must be a finite number > 0, got " + FormatDouble(hb.timeout_seconds));
  }
  if (hb.timeout_seconds <= hb.interval_seconds) {
    if (Blame(c, "heartbeat.timeout_seconds", "heartbeat.interval_seconds") ==
        "heartbeat.timeout_seconds") {
      return Bad(c, "heartbeat.timeout_seconds",
                 "must be > heartbeat.interval_seconds (" + FormatDouble(hb.interval_seconds) +
                     "), got " + FormatDouble(hb.timeout_seconds));
    }
    return Bad(c, "heartbeat.interval_seconds",
               "must be < heartbeat.timeout_seconds (" + FormatDouble(hb.timeout_seconds) +
                   "), got " + FormatDouble(hb.interval_seconds));
  }

  if (!(hb.forget_failed_after_seconds > 0) || !std::isfinite(hb.forget_failed_after_seconds)) {
    return Bad(c, "heartbeat.forget_failed_after_seconds",
               "must be a finite number > 0, got " + FormatDouble(hb.forget_failed_after_seconds));
  }
  for (const auto& [key, v] :
       {std::pair<const char*, double>{"heartbeat.load_timeout_seconds", hb.load_timeout_seconds},
        {"heartbeat.step_timeout_seconds", hb.step_timeout_seconds}})
    if (!(v > 0) || !std::isfinite(v))
      return Bad(c, key, "must be a finite number > 0, got " + FormatDouble(v));

  // [kv_cache]
  const KvCacheSection& kv = c.kv_cache;
  if (!(kv.memory_fraction > 0 && kv.memory_fraction <= 1)) {
    return Bad(c, "kv_cache.memory_fraction",
               "must be in (0, 1], got " + FormatDouble(kv.memory_fraction));
  }
  if (kv.block_size < 1)
    return Bad(c, "kv_cache.block_size", fmt::format("must be >= 1, got {}", kv.block_size));
  if (kv.max_blocks < 0) {
    return Bad(c, "kv_cache.max_blocks",
               fmt::format("must be >= 0 (0 = no bound), got {}", kv.max_blocks));
  }

  // [scheduler]
  const SchedulerSection& s = c.scheduler;
  for (auto [key, v] :
       {std::pair<const char*, int64_t>{"scheduler.max_batch_tokens", s.max_batch_tokens},
        {"scheduler.max_sequences", s.max_sequences},
        {"scheduler.queue_limit", s.queue_limit},
        {"scheduler.prefill_chunk_tokens", s.prefill_chunk_tokens}}) {
    if (v < 1) return Bad(c, key, fmt::format("must be >= 1, got {}", v));
  }
  if (!(s.drain_timeout_seconds >= 0) || !std::isfinite(s.drain_timeout_seconds)) {
    return Bad(c, "scheduler.drain_timeout_seconds",
               "must be a finite number >= 0, got " + FormatDouble(s.drain_timeout_seconds));
  }
  if (s.max_context < 0) {
    return Bad(c, "scheduler.max_context",
               fmt::format("must be >= 0 (0 = the model's max_position_embeddings), got {}",
                           s.max_context));
  }
  for (auto [key, v] :
       {std::pair<const char*, int64_t>{"scheduler.max_prompt_tokens", s.max_prompt_tokens},
        {"scheduler.max_completion_tokens", s.max_completion_tokens}}) {
    if (v < 0) return Bad(c, key, fmt::format("must be >= 0 (0 = max_context alone), got {}", v));
  }
  for (auto [key, v] : {std::pair<const char*, int64_t>{"scheduler.max_sequences", s.max_sequences},
                        {"scheduler.prefill_chunk_tokens", s.prefill_chunk_tokens}}) {
    if (v <= s.max_batch_tokens) continue;
    if (Blame(c, key, "scheduler.max_batch_tokens") == key) {
      return Bad(
          c, key,
          fmt::format("must be <= scheduler.max_batch_tokens ({}), got {}", s.max_batch_tokens, v));
    }
    return Bad(c, "scheduler.max_batch_tokens",
               fmt::format("must be >= {} ({}), got {}", key, v, s.max_batch_tokens));
  }

  // [worker]
  const WorkerSection& w = c.worker;
  std::string coord_host;
  int coord_port = 0;
  why = ParseEndpoint(w.coordinator, EndpointUse::kConnect, &coord_host, &coord_port);
  if (!why.empty()) return Bad(c, "worker.coordinator", why);

  // [control]
  const ControlSection& ctl = c.control;
  for (size_t i = 0; i < ctl.worker_public_keys.size(); ++i) {
    if (!IsZ85Key(ctl.worker_public_keys[i]))
      return Bad(c, "control.worker_public_keys",
                 fmt::format("entry {} must be a 40-character Z85 CURVE public key (tessera "
                             "keygen), got {}",
                             i, Quote(ctl.worker_public_keys[i])));
  }
  if (!ctl.coordinator_public_key.empty() && !IsZ85Key(ctl.coordinator_public_key))
    return Bad(c, "control.coordinator_public_key",
               "must be a 40-character Z85 CURVE public key (tessera keygen), got " +
                   Quote(ctl.coordinator_public_key));
  if (ctl.coordinator_secret_key_file.empty() != ctl.worker_public_keys.empty()) {
    if (ctl.worker_public_keys.empty())
      return Bad(c, "control.coordinator_secret_key_file",
                 "is set but control.worker_public_keys is empty: no worker could connect");
    return Bad(c, "control.worker_public_keys",
               "is set but control.coordinator_secret_key_file is not; CURVE needs the "
               "coordinator's secret key");
  }
  if (ctl.worker_secret_key_file.empty() != ctl.coordinator_public_key.empty()) {
    const char* set = ctl.worker_secret_key_file.empty() ? "control.coordinator_public_key"
                                                         : "control.worker_secret_key_file";
    const char* missing = ctl.worker_secret_key_file.empty() ? "control.worker_secret_key_file"
                                                             : "control.coordinator_public_key";
    return Bad(c, set, std::string("is set but ") + missing + " is not; CURVE needs both");
  }
  if (!IsLoopback(control_host) && ctl.coordinator_secret_key_file.empty())
    return Bad(c, "server.control_endpoint",
               Quote(srv.control_endpoint) +
                   " exposes the control plane beyond loopback without CURVE; set "
                   "control.coordinator_secret_key_file and control.worker_public_keys "
                   "(tessera keygen), or bind it to a loopback address");
  if (!IsLoopback(coord_host) && ctl.worker_secret_key_file.empty())
    return Bad(c, "worker.coordinator",
               Quote(w.coordinator) +
                   " is beyond loopback: the control plane needs CURVE; set "
                   "control.worker_secret_key_file and control.coordinator_public_key "
                   "(tessera keygen)");
  {
    // The workers the coordinator waits for must fit in its records.
    const int wanted = c.parallel.ExpectedWorkers();
    // Blame what the operator set: the layout, unless max_workers was set
    // too (pp = 99 named server.max_workers, a key nobody had written).
    const bool explicit_layout = c.parallel.mode == ParallelMode::kExplicit;
    if (wanted > c.server.max_workers && IsSet(c, "server.max_workers"))
      return Bad(c, "server.max_workers",
                 fmt::format("must be >= the {} workers the coordinator waits for ({}), got {}",
                             explicit_layout ? "tp * pp" : "parallel.workers", wanted,
                             c.server.max_workers));
    if (wanted > c.server.max_workers) {
      const char* key = explicit_layout ? LayoutKeyToBlame(c) : "parallel.workers";
      return Bad(c, key,
                 fmt::format("the coordinator would wait for {} workers ({}), more than "
                             "server.max_workers ({}, its default) keeps records of; make the "
                             "layout smaller or raise server.max_workers",
                             wanted, explicit_layout ? "tp * pp" : "parallel.workers",
                             c.server.max_workers));
    }
  }
  if (w.device < 0) return Bad(c, "worker.device", fmt::format("must be >= 0, got {}", w.device));
  if (!w.host.empty()) TESSERA_RETURN_IF_ERROR(CheckHost(c, "worker.host", w.host));
  if (!w.gloo_host.empty()) TESSERA_RETURN_IF_ERROR(CheckHost(c, "worker.gloo_host", w.gloo_host));
  TESSERA_RETURN_IF_ERROR(CheckPort(c, "worker.metrics_port", w.metrics_port, true));
  if (w.metrics_port != 0) {
    TESSERA_RETURN_IF_ERROR(CheckHost(c, "worker.metrics_host", w.metrics_host));
    if (w.metrics_port + w.device > 65535) {
      return Bad(
          c, "worker.metrics_port",
          fmt::format("the worker listens on metrics_port + device = {} + {} = {}, above 65535",
                      w.metrics_port, w.device, w.metrics_port + w.device));
    }
  }
  return Status::Ok();
}

}  // namespace tessera
