// DaemonConfig: the typed configuration of tessera-coordinator and
// tessera-worker, read from a TOML file (configs/*.toml, documented key by key
// in docs/configuration.md) plus `--set table.key=value` overrides.
//
// One file configures a whole deployment: the coordinator reads every table,
// a worker reads [worker] and [logging]. Every field has a default, so an empty
// file is a valid single-host loopback setup.
//
// Parsing and validation happen in one place (daemon_config.cc):
//  - the TOML parser (toml++) checks syntax;
//  - a table of every known key checks that keys exist (unknown keys are
//    errors: typo protection), that values have the right TOML type, and that
//    enum strings name a valid choice;
//  - ValidateDaemonConfig checks ranges and relations between keys.
// Every error is kInvalidArgument and reads
//   "<file>:<line>:<col>: <table>.<key>: <what is wrong>, got <value>"
// e.g. "configs/x.toml:12:7: scheduler.max_batch_tokens: must be >= 1, got 0".
// For a value given by an override the location is the flag itself
// ("--set scheduler.queue_limit=0"); for a key left at its default it is the
// file alone.
//
// Relative paths (model.path, admin.token_file, server.tls_*) are relative to
// the daemon's working directory, not to the config file.
//
// Thread-safety: DaemonConfig is a plain value. The functions are reentrant;
// distinct configs may be parsed from distinct threads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/format/kv_cache_dtype.h"
#include "common/format/quantization.h"
#include "common/grammar/grammar_library_paths.h"
#include "common/net/net_defaults.h"
#include "common/tokenizer/chat_template.h"

namespace tessera {

// [model]: what to serve.
struct ModelSection {
  // Directory holding the Hugging Face checkpoint (config.json,
  // *.safetensors, tokenizer.json, tokenizer_config.json). Its existence is
  // checked when the coordinator loads the model, not here.
  std::string path = "models/default";
  // The model id clients send in "model" and /v1/models lists. "" = the last
  // component of `path`. See ServedModelName().
  std::string name;
  // Weight and activation dtype: nullopt ("auto") = the checkpoint's
  // torch_dtype; else kF32 ("float32"), kBF16 ("bfloat16") or kF16
  // ("float16"). Narrower types halve weight and KV bytes at some accuracy
  // cost; the CPU backend computes in float32 whatever the choice.
  std::optional<DType> dtype;
  // Chat template override: nullopt ("") = render the model's own Jinja
  // chat_template (tokenizer_config.json or chat_template.jinja); "chatml",
  // "llama3" or "llama2" force a built-in format instead (for a model without
  // a template, or one using a Jinja construct Tessera refuses).
  std::optional<ChatFormat> chat_template;
  // Online quantization at load: kNone ("none", the checkpoint as it is) or
  // kOnlineFp8 ("fp8": a bf16/f16/f32 checkpoint's linear projections are
  // quantized to FP8 e4m3 with one scale per output channel, slice by slice
  // on each rank; common/format/quantization.h). Halves the weight bytes of
  // bf16 on a backend that keeps FP8 (the planner counts FP8 bytes); the CPU
  // backend computes with the dequantized weights, so only the rounding
  // changes there. A checkpoint that is FP8 already keeps its own scales.
  QuantMethod quantization = QuantMethod::kNone;
};

enum class ParallelMode {
  kAuto,      // "auto": the planner picks tp and pp from the workers' devices
  kExplicit,  // "explicit": tp, pp and layers_per_stage below
};

enum class ParallelObjective {
  kLatency,     // "latency": the lowest per-token decode latency
  kThroughput,  // "throughput": the most generated tokens per second
};

// One explicit layout: tp (or a tp per stage), pp and the layer split, as
// the keys of [parallel] (ParallelSection is one) and of a
// parallel.replica_override entry give it.
struct LayoutSection {
  // Tensor-parallel ranks per stage (explicit mode). More ranks split each
  // layer's matmuls further (less memory and time per rank) at the cost of two
  // all-reduces per layer; keep a tp group within one host. Must divide the
  // model's attention heads (checked against the model when planning).
  // In the file an integer (every stage) or an array with one entry per
  // stage, e.g. `tp = [2, 1]` (a host of 2 ranks feeding a host of 1): then
  // tp is 0 and tp_per_stage holds the array.
  int tp = 1;
  // The per-stage form of tp: empty, or pp entries, each >= 1.
  std::vector<int> tp_per_stage;
  // Pipeline stages (explicit mode). More stages hold fewer layers each, at the
  // cost of one activation transfer per stage boundary and pp micro-batches
  // needed in flight to keep every stage busy.
  int pp = 1;
  // Decoder layers per stage, in stage order (explicit mode). Empty = even
  // split. Otherwise pp entries, each >= 1; their sum must equal the model's
  // num_hidden_layers (checked against the model when planning).
  std::vector<int> layers_per_stage;

  // The tp of stage `stage`: tp_per_stage[stage], or tp.
  int TpOfStage(int stage) const {
    return tp_per_stage.empty() ? tp : tp_per_stage[static_cast<size_t>(stage)];
  }
  // Worker ranks of the layout: the sum of the stages' tp.
  int world_size() const {
    int w = 0;
    for (int s = 0; s < pp; ++s) w += TpOfStage(s);
    return w;
  }
};

// [[parallel.replica_override]]: replica `replica`'s own layout in explicit
// mode, for replicas on hosts that differ (a host of 2 GPUs beside hosts of
// 4). The entry is the replica's whole layout: a key it leaves out takes
// [parallel]'s default (tp 1, pp 1, an even split), not [parallel]'s value.
struct ReplicaOverride {
  // The replica it applies to: 0 <= replica < parallel.replicas, each at most
  // once.
  int replica = 0;
  // Its tp (an integer, or an array with one entry per stage), pp and
  // layers_per_stage, checked as [parallel]'s are (and against the model
  // when the coordinator starts).
  LayoutSection layout;
};

// [parallel]: how the model is split over workers (see common/model/parallel_config.h).
// The layout keys (tp, tp_per_stage, pp, layers_per_stage) and their
// defaults are LayoutSection's.
struct ParallelSection : LayoutSection {
  // MoE models (docs/architecture.md "The MoE layer"): false = every tp rank
  // holds a 1/tp slice of every expert (as the dense MLP is split); true =
  // every tp rank holds whole experts, 1/tp of them (uneven counts spread as
  // evenly as they allow), routes every token and runs only its own. Whole
  // experts run fewer, larger GEMMs per rank and lift the need for tp to
  // divide moe_intermediate_size; slices keep every rank's work equal
  // whatever the routing. Ignored for dense models; either mode.
  bool expert_parallel = false;

  // "auto" or "explicit". When the file does not name a mode, setting any of
  // tp, pp or layers_per_stage selects "explicit"; otherwise "auto". In "auto"
  // mode tp, pp and layers_per_stage must not be set.
  ParallelMode mode = ParallelMode::kAuto;

  // Workers the coordinator waits for before it plans; the plan uses those
  // that registered first. 0 = replicas * tp * pp in explicit mode (with
  // replica_overrides: the sum of every replica's tp * pp), 1 in auto mode.
  // In explicit mode a non-zero value must equal that count (or, with
  // replicas = 0, be at least tp * pp). Workers the plan leaves
  // idle are spares: listed at /admin/cluster, taken by a replica that loses
  // a worker, and shut down with the rest.
  int workers = 0;
  // What "auto" optimises (docs/planner.md): "latency" or "throughput".
  ParallelObjective objective = ParallelObjective::kLatency;
  // Data-parallel replicas of the pipeline, each with its own workers,
  // scheduler and serving thread, behind one API (coordinator/serving/
  // replica_set.h). 0 = as many as fit the workers (explicit mode: parallel.
  // workers / (tp * pp), so parallel.workers must be set; auto mode: as many
  // as the planner fits). The default 1 serves one pipeline and leaves the
  // other workers spare, as before replicas existed. In explicit mode every
  // replica has the configured layout, unless replica_overrides gives it
  // its own. >= 0.
  int replicas = 1;

  // Per-replica layouts (explicit mode, parallel.replicas >= 1): replica
  // `replica` of an entry runs its own layout instead of tp / pp /
  // layers_per_stage above; the other replicas run those. In the file an
  // array of tables, [[parallel.replica_override]] with keys replica, tp,
  // pp, layers_per_stage. Empty = every replica runs the same layout.
  std::vector<ReplicaOverride> replica_overrides;

  // The layout of [parallel] itself (tp, tp_per_stage, pp, layers_per_stage).
  const LayoutSection& BaseLayout() const { return *this; }
  // Replica `replica`'s layout (explicit mode): its override, else BaseLayout().
  LayoutSection LayoutOfReplica(int replica) const {
    for (const ReplicaOverride& o : replica_overrides)
      if (o.replica == replica) return o.layout;
    return BaseLayout();
  }
  // Worker ranks of every replica together (explicit mode, replicas >= 1):
  // the sum of each replica's world_size(); replicas = 0 counts one.
  int64_t ReplicasWorldSize() const {
    const int n = replicas > 0 ? replicas : 1;
    int64_t w = static_cast<int64_t>(n) * world_size();
    for (size_t i = 0; i < replica_overrides.size(); ++i) {
      const ReplicaOverride& o = replica_overrides[i];
      bool first = o.replica >= 0 && o.replica < n;  // LayoutOfReplica takes the first
      for (size_t j = 0; j < i && first; ++j) first = replica_overrides[j].replica != o.replica;
      if (first) w += o.layout.world_size() - world_size();
    }
    return w;
  }

  // The workers the coordinator waits for before it plans (see workers).
  int ExpectedWorkers() const {
    if (mode == ParallelMode::kAuto) return workers > 0 ? workers : 1;
    if (workers > 0) return workers;
    return static_cast<int>(ReplicasWorldSize());
  }
};

// [server]: the coordinator's listeners.
struct ServerSection {
  // Address the OpenAI-compatible HTTP API binds. "127.0.0.1" serves this host
  // only; "0.0.0.0" (or "::") serves every interface.
  std::string host = "127.0.0.1";
  // TCP port of the HTTP API, 0..65535; 0 = a port the kernel picks when the
  // coordinator starts (reported by tessera-coordinator --ports-file and the
  // startup log line), so nothing else can take it first; clients must then
  // be told the port.
  int port = 8000;
  // ZeroMQ endpoint the coordinator's ROUTER socket binds for the control
  // plane, "tcp://HOST:PORT" (HOST may be "*" for every interface; PORT 0 =
  // one the kernel picks, reported like server.port = 0, and then not
  // inferred for worker.coordinator). Workers connect to it
  // (worker.coordinator); it must be reachable from every host that runs a
  // worker.
  std::string control_endpoint = "tcp://127.0.0.1:5555";
  // PEM certificate chain and private key for HTTPS on the API (and on a
  // separate admin listener). Both or neither; "" = plain HTTP.
  std::string tls_cert;
  std::string tls_key;
  // Seconds a connection may take to deliver a request's headers and body
  // before it is closed. Lower frees slots held by slow or stalled clients
  // sooner; too low cuts off clients on slow links.
  double read_timeout_seconds = kDefaultHttpReadTimeoutSeconds;
  // Largest request body accepted, bytes; larger requests get 413. Bounds
  // the memory one request can take (a 32k-token prompt as token ids is about
  // 200 KiB of JSON).
  int64_t max_body_bytes = kDefaultHttpMaxBodyBytes;
  // Connections served at once; further connections are refused until one
  // closes. Each streaming request holds one connection for its whole life.
  int max_connections = kDefaultHttpMaxConnections;
  // Header fields accepted in one request, >= 1; more get 431. Bounds the
  // work and memory of parsing a hostile request's header.
  int max_header_count = kDefaultHttpMaxHeaderCount;
  // Streaming responses (stream: true) open at once, >= 1; a request for
  // another gets 429 naming this key. Bounds the connections and threads'
  // time long-lived streams may hold, leaving room for other clients.
  int max_streams = 256;
  // Workers the control plane keeps records of at once, >= 1: live ones
  // plus failed ones not yet forgotten (heartbeat.forget_failed_after_seconds).
  // A Register beyond it is refused and logged. Bounds the memory and the
  // /admin/cluster size a flood of registrations can cost; set it above the
  // largest fleet this coordinator serves, with room for restarts.
  int max_workers = 256;
  // Largest prompt accepted, bytes of text (a completion's prompt, each one
  // of a list; a chat request's message contents together), >= 1; larger
  // get 413 naming this key, before any tokenization. Bounds the CPU one
  // request costs the coordinator (tokenizing ~1 MiB of text takes tens to
  // hundreds of ms); a prompt of token ids is bounded by max_body_bytes.
  int64_t max_prompt_bytes = 1 << 20;
  // Threads that prepare requests (parse the body, render the chat
  // template, tokenize) off the HTTP I/O threads, at a lower CPU priority
  // than serving; 0 = one per two hardware threads (at least 1). At most
  // max_connections requests wait for one; more get 503.
  int request_threads = 0;
};

// [heartbeat]: failure detection between coordinator and workers.
struct HeartbeatSection {
  // Seconds between heartbeats sent by each worker. Lower detects failures
  // sooner at the cost of more control-plane messages.
  double interval_seconds = 1.0;
  // Seconds without a heartbeat after which a worker is marked failed; must be
  // > interval_seconds. Several intervals avoid false failures under load
  // (a long prefill or a loaded host delays heartbeats).
  double timeout_seconds = 10.0;
  // Seconds a failed (lost) worker's record is kept, > 0; then it is
  // forgotten: gone from /admin/cluster, tessera_workers{state="failed"} and
  // the server.max_workers count. Longer keeps a dead worker visible to
  // operators; shorter frees room for new registrations sooner.
  double forget_failed_after_seconds = 300.0;
  // Seconds the workers of a new plan get to join their groups and report
  // Loaded, > 0. A worker that has not by then (or that made its peers'
  // rendezvous fail) is named in the error and left out of the next
  // placement attempt for a back-off (this long, doubling with each
  // exclusion of the same worker up to 1 hour), so re-plans converge onto
  // workers that do load. Longer suits slow disks and large shards; shorter
  // recovers sooner from a worker that never loads.
  double load_timeout_seconds = 120.0;
  // Seconds one step (a micro-batch through the pipeline) may take before
  // it is declared hung, > 0: the replica re-plans as for a lost worker,
  // leaving out the rank that was still computing (named in the error), and
  // its requests resume elsewhere. Must exceed the longest step (a full
  // scheduler.max_batch_tokens prefill on the slowest worker) with margin,
  // and be at most the workers' collective timeout (tessera-worker
  // --timeout, 30 s by default), else a peer's timeout reports the hang
  // first without naming the rank.
  double step_timeout_seconds = 30.0;
};

// [kv_cache]: the paged KV cache on every worker.
struct KvCacheSection {
  // Fraction of each device's memory (as the worker reports it at
  // registration) that weights plus KV cache may use, in (0, 1]; the KV cache
  // gets what is left after the weights. Higher means more concurrent tokens;
  // leave headroom for activations and, on CPU, for everything else on the
  // host.
  double memory_fraction = 0.9;
  // Tokens per KV block. Smaller blocks waste less memory at the end of each
  // sequence; larger blocks mean shorter block tables and fewer allocations.
  int block_size = 16;
  // Upper bound on KV blocks per worker; 0 = no bound (memory_fraction alone
  // decides). Useful on CPU hosts where memory_fraction of RAM is far more than
  // the workload needs.
  int64_t max_blocks = 0;
  // Prefix caching: full KV blocks are kept after their sequence finishes,
  // keyed by their tokens and everything before them, and a new request
  // whose prompt starts with the same blocks reuses them instead of
  // prefilling them again (shared system prompts, few-shot examples, earlier
  // turns of a chat). Unreferenced cached blocks are evicted least recently
  // used when the pool needs room, so it costs no capacity; off only to
  // measure without it.
  bool prefix_caching = true;
  // Element type of the cache (common/format/kv_cache_dtype.h): "auto" = the
  // model's compute dtype (F32 on CPU workers); "fp8" = float8 e4m3 with one
  // scale per layer for K and one for V, taken from the checkpoint
  // (`self_attn.k_scale` / `v_scale`, or `kv_scale`), else 1.0. fp8 halves
  // the KV bytes of a bf16 model (a quarter of F32 on CPU), so about twice
  // the blocks fit, at the cost of KV rounding to 3 mantissa bits.
  KvCacheDType dtype = KvCacheDType::kAuto;
};

// [scheduler]: continuous batching and admission control on the coordinator.
// Where each replica's scheduler runs ([scheduler] runs_on).
enum class SchedulerHost {
  kCoordinator,  // "coordinator": the coordinator schedules every replica's steps
  kLeader,       // "leader": each replica's leader (stage 0, tp rank 0) schedules itself
};

// How long a prompt's prefill chunks are ([scheduler] prefill_chunk_budget).
enum class PrefillChunkBudget {
  kCost,    // "cost": later chunks shrink so each costs what the first one did
  kTokens,  // "tokens": every chunk is prefill_chunk_tokens long
};

struct SchedulerSection {
  // Tokens processed per iteration over all sequences (prefill chunks plus one
  // per decoding sequence). Higher raises throughput and per-iteration latency
  // and activation memory. Must be >= max_sequences and >= prefill_chunk_tokens.
  int64_t max_batch_tokens = 4096;
  // Sequences running at once (those holding KV blocks). Higher raises decode
  // throughput until the KV cache runs out, after which sequences are preempted.
  int64_t max_sequences = 128;
  // Requests waiting for admission; a request arriving to a full queue gets
  // HTTP 429. Higher absorbs bursts; lower bounds queueing latency.
  int64_t queue_limit = 256;
  // Longest sequence (prompt + generated tokens) accepted, tokens; longer
  // prompts get HTTP 400 naming the limit. 0 = the model's default context;
  // a value over the model's limit is refused when the model loads (both
  // from ModelContextLimit, common/format/model_config.h: dynamic NTK RoPE
  // runs past max_position_embeddings).
  int64_t max_context = 0;
  // Prompt tokens prefilled per sequence per iteration (chunked prefill). Smaller
  // chunks keep decode latency steady while long prompts are prefilled; larger
  // chunks finish prefill in fewer iterations. Must be <= max_batch_tokens. On an
  // H100 (Llama-3-8B shape, 32 sequences decoding, an 8k prompt every second)
  // the decoders' inter-token p99 was 1.76 x their p50 alone at 128, 2.61 x at
  // 256 and 3.85 x at 512; the 8k prompts' TTFT 678, 487 and 362 ms
  // (bench/results/NOTES.md, 2026-12-07, later).
  int64_t prefill_chunk_tokens = 512;
  // "tokens": every chunk is prefill_chunk_tokens long. "cost": a prompt's
  // first chunk is prefill_chunk_tokens long and each later one shrinks so that
  // it costs what the first did by the FLOP model of common/engine/
  // prefill_chunk.h, counting its attention to the prompt's tokens already
  // prefilled. Measured on an H100 in the run above, "cost" was worse: p99
  // 2.90 x at 128 (against 1.76 x), 2.89 x at 256 (2.61 x): a step with a chunk
  // has a fixed cost beyond its FLOPs (it runs outside the decode CUDA graph),
  // so smaller chunks add steps, a long prompt takes longer and overlaps the
  // next (two chunks in one step). Hence "tokens".
  PrefillChunkBudget prefill_chunk_budget = PrefillChunkBudget::kTokens;
  // Largest prompt accepted, tokens (per prompt, after tokenization and the
  // chat template); longer prompts get HTTP 400 naming this key. 0 = no
  // bound but max_context.
  int64_t max_prompt_tokens = 0;
  // Largest max_tokens a request may ask for, tokens; a request asking for
  // more gets HTTP 400 naming this key, and a chat request without
  // max_tokens generates at most this many. 0 = no bound but max_context.
  int64_t max_completion_tokens = 0;
  // When the plan changes (POST /admin/plan, a worker drained), seconds the
  // running sequences get to finish before the rest are re-queued; they
  // resume on the new plan from prompt + generated tokens. Higher lets more
  // requests finish undisturbed; lower makes the change take effect sooner.
  // After a fault nothing waits: the plan is broken.
  double drain_timeout_seconds = 10.0;
  // Where each replica's scheduler, KV block allocator and output processing
  // run. "coordinator": in the coordinator, which sends every step to the
  // workers. "leader": in the replica's leader worker (stage 0, tp rank 0),
  // which runs its own steps; the coordinator routes each request to a
  // replica and relays its progress, and keeps each request's tokens so
  // that a request resumes on the next plan. "leader" serves any explicit
  // layout (any tp and pp) in this version (parallel.mode = "explicit").
  SchedulerHost runs_on = SchedulerHost::kCoordinator;
};

// [admin]: the admin API (/admin/cluster, /admin/plan).
struct AdminSection {
  // Address and port of a separate admin listener. port = 0 serves the admin
  // endpoints on the API listener (server.host:server.port) instead.
  std::string host = "127.0.0.1";
  int port = 8001;
  // true: the separate admin listener binds a port the kernel picks, as
  // server.port = 0 does for the API (tessera-coordinator --ports-file and
  // the startup log report it); admin.port must then be left unset. For
  // tests and several coordinators on one host; a fixed port is easier to
  // reach and to firewall.
  bool pick_port = false;
  // Bearer token the admin endpoints require ("Authorization: Bearer TOKEN").
  // At most one of token and token_file. With neither, the admin API is open,
  // which is allowed only while it listens on a loopback address.
  std::string token;
  // File whose contents (surrounding whitespace removed) are the token; read
  // when the config is loaded. Keeps the secret out of the config file. It
  // must not be accessible by group or others (mode 0600), like a CURVE
  // secret key file.
  std::string token_file;
  // The token the admin API checks: `token`, or the contents of `token_file`;
  // "" = no token. Filled by the loader, not a TOML key.
  std::string effective_token;
};

// [control]: authentication and encryption of the control plane (ZeroMQ
// CURVE). Keys are made by `tessera keygen` (common/net/curve_keys.h). A control
// plane reachable beyond loopback must use CURVE: server.control_endpoint on
// a non-loopback address needs coordinator_secret_key_file, and
// worker.coordinator on a non-loopback address needs worker_secret_key_file.
struct ControlSection {
  // Coordinator: file holding its CURVE secret key; "" = no CURVE. Read when
  // the coordinator starts (mode 0600 required).
  std::string coordinator_secret_key_file;
  // Coordinator: Z85 public keys of the workers allowed to connect; any other
  // key is refused at the handshake and logged. Required with
  // coordinator_secret_key_file.
  std::vector<std::string> worker_public_keys;
  // Worker: file holding this worker's CURVE secret key; "" = no CURVE. Read
  // when the worker starts. "{device}" in it becomes the worker's device
  // index ("keys/worker-{device}.key"): the coordinator admits one worker
  // per key, so workers sharing a config file need one key each.
  std::string worker_secret_key_file;
  // Worker: the coordinator's Z85 public key. Required with
  // worker_secret_key_file.
  std::string coordinator_public_key;
  // Both daemons: run the control plane without CURVE when no keys are
  // configured. false (the default) makes a coordinator without
  // coordinator_secret_key_file, or a worker without worker_secret_key_file,
  // refuse to start: without CURVE any local process can register as a
  // worker and inject results. true logs a warning at start; only for
  // single-user hosts and tests. Loopback endpoints only (see above).
  bool allow_unauthenticated = false;
};

// [store]: the coordinator's rendezvous store (common/net/tcp_store.h), where a
// plan's ranks find each other. Clients authenticate (common/net/store_auth.h);
// these bound what any client, authenticated or not, can make the
// coordinator hold: at most max_connections x (512 B before authentication,
// about 2 x max_frame_bytes after) plus max_bytes of data. A request over a
// limit is refused with an error naming the key.
struct StoreSection {
  // Largest request frame, bytes (header excluded, HMAC tag included).
  // Rendezvous values are a few KiB (Gloo addresses, NCCL ids); larger frames
  // are cut off before the server buffers them. 4096..1073741824.
  int64_t max_frame_bytes = kDefaultStoreMaxFrameBytes;
  // Connections open at once. Every rank holds one while it rendezvouses;
  // at the limit a new connection displaces the oldest one still in its
  // handshake, and is refused when all are authenticated.
  int max_connections = kDefaultStoreMaxConnections;
  // Keys stored at once. A plan writes a few per rank and pipeline link; a
  // new plan's start erases the previous plan's keys.
  int64_t max_keys = kDefaultStoreMaxKeys;
  // Bytes of keys plus values stored at once.
  int64_t max_bytes = kDefaultStoreMaxBytes;
  // Seconds a new connection has to authenticate before it is closed. Short
  // frees slots held by idle clients sooner; too short fails ranks on a
  // loaded host.
  double handshake_timeout_seconds = kDefaultStoreHandshakeTimeoutSeconds;
};

enum class LogFormat {
  kText,  // "text": one human-readable line per event
  kJson,  // "json": one JSON object per line, for log collectors
};

// [logging]: both daemons.
struct LoggingSection {
  // Least severe level written: "trace", "debug", "info", "warn", "error" or
  // "critical". trace and debug log every step and message (slow, verbose).
  LogLevel level = LogLevel::kInfo;
  LogFormat format = LogFormat::kText;
};

enum class WorkerBackend {
  kAuto,  // "auto": CUDA when built with it and a GPU is visible, else CPU
  kCpu,   // "cpu"
  kCuda,  // "cuda"
};

// [worker]: one tessera-worker process. Usually shared by every worker of a
// deployment, with `device` given per process on the command line.
struct WorkerSection {
  // The coordinator's control endpoint to connect to, "tcp://HOST:PORT".
  // When not set and server.control_endpoint is set on a loopback or
  // wildcard host, that endpoint (a wildcard becomes 127.0.0.1).
  std::string coordinator = "tcp://127.0.0.1:5555";
  // Device index on this host (GPU ordinal for cuda; on cpu, a slot number
  // that tells co-located CPU workers apart). >= 0.
  int device = 0;
  // Compute backend of this worker.
  WorkerBackend backend = WorkerBackend::kAuto;
  // Host name this worker reports when it registers; the coordinator groups
  // workers into hosts by it (CPU ranks of one host share its memory; tp
  // groups stay inside a host). "" = the topology report's host name
  // (gethostname(), or the one in topology_file).
  std::string host;
  // Address this worker binds for Gloo collectives and pipeline transfers,
  // and advertises to its peers; it must be reachable from the other workers.
  // "" = the address of this host's interface that routes to the
  // coordinator (right whenever the coordinator and the workers share a
  // network).
  std::string gloo_host;
  // A topology file describing this host (docs/topology.md: TOML with one
  // host, or `tessera topo --json` output) to report at registration instead
  // of discovering it; for hosts whose discovery misses something, and for
  // tests. "" = discover (NVML, hwloc, sysfs).
  std::string topology_file;
  // Address and TCP port of the worker's metrics endpoint; port 0 = off.
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 0;
};

// [structured_output]: where the grammar engine of response_format
// (LLGuidance, common/grammar/) is loaded from, on the coordinator (which
// compiles a request's schema to refuse a bad one with 400) and on the
// workers (whose sampling rank masks the logits). A missing library refuses
// only requests with a response_format other than text, naming the file.
struct StructuredOutputSection {
  // The shared library of the llguidance wheel; default: where scripts/setup
  // unpacks it ($TESSERA_CACHE/llguidance-<version>/llguidance/_lib.abi3.so).
  std::string llguidance_library = DefaultGrammarLibraryPaths().llguidance_library;
  // The libpython3 resolving that library's CPython symbols (it is a Python
  // extension module; no interpreter is started): a name the dynamic loader
  // finds or a path.
  std::string python_library = DefaultGrammarLibraryPaths().python_library;
  GrammarLibraryPaths paths() const { return {llguidance_library, python_library}; }
};

struct DaemonConfig {
  ModelSection model;
  ParallelSection parallel;
  ServerSection server;
  HeartbeatSection heartbeat;
  KvCacheSection kv_cache;
  SchedulerSection scheduler;
  AdminSection admin;
  ControlSection control;
  StoreSection store;
  LoggingSection logging;
  WorkerSection worker;
  StructuredOutputSection structured_output;

  // Where the config came from, for error messages; not TOML keys.
  // The file parsed ("" for a default-constructed config).
  std::string path;
  // For every key given explicitly, "table.key" -> where it was set:
  // "<file>:<line>:<col>" or "--set table.key=value". Keys at their default
  // are absent.
  std::map<std::string, std::string> sources;
};

// "<where>: <key>" for errors found after the config loaded (a model.path
// without a model, a layout the model cannot take): where is the key's
// "<file>:<line>:<col>" or "--set key=value", else the file, e.g.
// "configs/local-cpu.toml:8:8: model.path". Use with Status::WithContext.
std::string ConfigKeyContext(const DaemonConfig& config, const std::string& key);

// The served model id: model.name, or the last component of model.path
// ("models/default" -> "default").
std::string ServedModelName(const ModelSection& model);

// Names as written in TOML ("info", "json", "explicit", "cuda").
const char* LogLevelName(LogLevel level);
const char* LogFormatName(LogFormat format);
const char* ParallelModeName(ParallelMode mode);
const char* ParallelObjectiveName(ParallelObjective objective);
const char* WorkerBackendName(WorkerBackend backend);

// Reads the TOML file at `path` and parses it as ParseDaemonConfig does.
// Errors: kNotFound naming the path when it does not exist, kIoError when it
// cannot be read, else as ParseDaemonConfig.
StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path);

// Parses `text` (the contents of `path`, used in error messages), validates it
// (ValidateDaemonConfig) and reads admin.token_file. Errors (kInvalidArgument,
// with "<path>:<line>:<col>" and the full key):
//  - malformed TOML (the parser's description);
//  - an unknown table or key (listing the valid ones);
//  - a value of the wrong TOML type (naming the expected and the given type)
//    or an enum string that is not a valid choice (listing the choices);
//  - any check of ValidateDaemonConfig;
//  - admin.token_file or server.tls_cert/tls_key that cannot be read, or an
//    empty token file.
StatusOr<DaemonConfig> ParseDaemonConfig(const std::string& text, const std::string& path);

// Checks ranges and relations between keys; locations come from
// `config.sources`. Errors (kInvalidArgument):
//  - model.path empty;
//  - parallel: tp, pp or layers_per_stage set in "auto" mode; tp or pp < 1;
//    tp given per stage with a size other than pp or an entry < 1;
//    layers_per_stage non-empty with a size other than pp or an entry < 1;
//    workers < 0, or other than 0 and replicas x tp * pp in explicit mode
//    (the sum of every replica's tp * pp with replica overrides);
//    replica_override: set in "auto" mode or with replicas = 0, an entry
//    without `replica`, an index outside 0..replicas-1 or given twice, an
//    unknown key, or a layout failing the checks of tp, pp and
//    layers_per_stage above (named parallel.replica_override[i].<key>);
//  - server/admin/worker hosts empty or not a host name or IP address; ports
//    outside 1..65535 (server.port, admin.port, worker.metrics_port and the
//    port of server.control_endpoint may be 0); admin.pick_port with
//    admin.port set; the API, admin and control-plane listeners on one
//    (non-zero) port of one address;
//    server.control_endpoint or worker.coordinator not "tcp://HOST:PORT"
//    (worker.coordinator not a wildcard address);
//  - server.tls_cert without tls_key or the reverse; read_timeout_seconds,
//    max_body_bytes, max_connections, max_header_count, max_streams,
//    max_workers or max_prompt_bytes < or = 0; request_threads < 0; max_workers below the workers
//    waited for (tp * pp in explicit mode, parallel.workers in auto mode);
//  - heartbeat interval or timeout not a finite number > 0, or
//    timeout_seconds <= interval_seconds; forget_failed_after_seconds,
//    load_timeout_seconds or step_timeout_seconds not a finite number > 0;
//  - kv_cache.memory_fraction outside (0, 1]; block_size < 1; max_blocks < 0;
//  - scheduler: max_batch_tokens, max_sequences, queue_limit or
//    prefill_chunk_tokens < 1; max_context, max_prompt_tokens or
//    max_completion_tokens < 0; max_sequences or prefill_chunk_tokens >
//    max_batch_tokens;
//  - admin: both token and token_file; a token with characters outside the
//    bearer-token set (RFC 6750 b64token); no token while the admin API
//    listens on a non-loopback address;
//  - control: a public key that is not 40 Z85 characters;
//    coordinator_secret_key_file without worker_public_keys or the reverse;
//    worker_secret_key_file without coordinator_public_key or the reverse;
//    server.control_endpoint (worker.coordinator) on a non-loopback address
//    without coordinator_secret_key_file (worker_secret_key_file);
//  - store: max_frame_bytes outside 4096..1073741824; max_connections,
//    max_keys or max_bytes < 1; handshake_timeout_seconds not a finite
//    number > 0;
//  - worker.device < 0.
Status ValidateDaemonConfig(const DaemonConfig& config);

// Applies one command-line override, `--set <dotted_key>=<value>`, then
// validates as ParseDaemonConfig does. For string keys `value` is taken
// verbatim (no quotes needed); for other keys it is a TOML value
// ("64", "0.5", "true", "[8, 8, 8]"). Setting parallel.mode = "auto" clears
// tp, pp and layers_per_stage; setting tp, pp or layers_per_stage when the
// file named no mode selects "explicit", as in the file.
// On error `config` is unchanged. Errors: kInvalidArgument naming
// "--set <dotted_key>=<value>" and the key for an unknown key, a wrong type,
// an invalid choice, or any ValidateDaemonConfig check.
Status ApplyOverride(DaemonConfig& config, const std::string& dotted_key, const std::string& value);

// Applies several "dotted.key=value" overrides, then validates once (so that
// overrides valid only together, e.g. heartbeat interval and timeout, can be
// given). On error `config` is unchanged. Errors: as ApplyOverride, and an
// assignment without '='.
Status ApplyOverrides(DaemonConfig& config, const std::vector<std::string>& assignments);

// The config as TOML text with every key, parseable by ParseDaemonConfig
// (for logging the effective config at startup). `redact_secrets` writes
// admin.token as "<redacted>" when it is set.
std::string FormatDaemonConfig(const DaemonConfig& config, bool redact_secrets);

}  // namespace tessera
