#include "bench/fleet_sim/sim_fleet.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>
#include <random>
#include <zmq.hpp>

#include "bench/fleet_sim/epoll_shard_loop.h"
#include "bench/fleet_sim/sim_leader.h"
#include "common/base/logging.h"
#include "common/net/curve_keys.h"
#include "common/wire/control_codec.h"

namespace tessera::fleet_sim {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kLog = "fleet-sim";

int32_t TokenAt(int64_t seq_id, int64_t pos, int32_t lo, int32_t hi) {
  return SimTokenAt(seq_id, pos, lo, hi);
}

}  // namespace

struct Shard;

struct Worker {
  int index = 0, node = 0, gpu = 0;
  Shard* shard = nullptr;
  size_t slot = 0;  // index of its socket in its shard's loop
  std::string routing_id;
  std::string requested_id;
  std::string worker_id;  // assigned
  std::string curve_secret, curve_public;
  std::unique_ptr<zmq::socket_t> dealer;
  control::Register registration;
  bool registered = false, dead = false, ever_registered = false;
  Clock::time_point next_register{}, next_heartbeat{};
  uint64_t tick_generation = 0;  // a scheduled tick of an older generation is stale
  std::chrono::milliseconds register_backoff{0};
  std::chrono::milliseconds heartbeat_interval{1000};
  control::Heartbeat heartbeat;
  control::AssignShard assign;
  bool has_assign = false;
  // Its replica's leader (AssignShard.leader), from its load on.
  std::unique_ptr<SimLeader> leader;
  uint64_t seq = 0;
};

struct Timer {
  Clock::time_point due;
  uint64_t order;
  std::function<void()> fn;
  bool operator>(const Timer& o) const { return due != o.due ? due > o.due : order > o.order; }
};

struct Shard {
  explicit Shard(int id) : loop("sim-shard-" + std::to_string(id)) {}
  EpollShardLoop loop;
  std::vector<Worker*> workers;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers;  // owner thread
  uint64_t next_order = 0;
  std::mt19937_64 rng{12345};
};

struct SimFleet::Impl {
  FleetOptions options;
  zmq::context_t context;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::unique_ptr<Shard>> shards;
  Clock::time_point started = Clock::now();

  std::atomic<int64_t> registered{0}, refused{0}, registers_sent{0}, heartbeats_sent{0},
      assigned{0}, loaded{0}, steps{0}, tokens{0}, killed{0}, first_registrations{0};
  std::atomic<double> all_registered_s{-1};

  // The sampler of each plan version, and when its last answer is due (a
  // pipeline answers in order).
  struct Plan {
    Worker* sampler = nullptr;
    Clock::time_point last_due{};
  };
  std::mutex plans_mu;
  std::map<uint64_t, Plan> plans;  // guarded by plans_mu

  explicit Impl(FleetOptions o)
      : options(std::move(o)), context(2, 4 * std::max(1, options.nodes) * 8 + 1024) {}

  // Owner-thread helpers.
  void Send(Worker& w, control::Envelope e);
  void SendRegister(Worker& w, Clock::time_point now);
  void SendHeartbeat(Worker& w, Clock::time_point now);
  void Schedule(Shard& s, Clock::time_point due, std::function<void()> fn);
  // Reads up to 64 frames; true when it stopped at EAGAIN or the worker is
  // dead (EpollShardLoop::Hooks::on_readable).
  bool ReadFrames(Worker& w);
  void Handle(Worker& w, const control::Envelope& e);
  void OnAssign(Worker& w, const control::AssignShard& a);
  void OnStep(Worker& w, const control::Step& step);
  // Worker `w` leads its replica (AssignShard.leader): a SimLeader whose
  // messages go out through w's shard.
  void StartLeader(Worker& w);
  void Close(Worker& w);
  void Scan(Shard& s);
  // The worker's next heartbeat or Register retry, at `due` (replacing the
  // one scheduled before).
  void ScheduleTick(Worker& w, Clock::time_point due);
  void Tick(Worker& w);
};

void SimFleet::Impl::Send(Worker& w, control::Envelope e) {
  if (w.dead || !w.dealer) return;
  e.set_protocol_version(kControlProtocolVersion);
  if (!e.has_register_worker()) e.set_worker_id(w.worker_id);
  e.set_seq(++w.seq);
  StatusOr<std::string> bytes = EncodeEnvelope(e);
  if (!bytes.ok()) {
    TESSERA_LOG_ERROR(kLog, "{}: {}", w.requested_id, bytes.status().ToString());
    return;
  }
  try {
    (void)w.dealer->send(zmq::buffer(*bytes), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& err) {
    TESSERA_LOG_WARN(kLog, "{}: send failed: {}", w.requested_id, err.what());
  }
  // The send may have taken the ZMQ_FD edge of input that came meanwhile.
  w.shard->loop.Touched(w.slot);
}

void SimFleet::Impl::SendRegister(Worker& w, Clock::time_point now) {
  control::Envelope e;
  e.set_worker_id(w.requested_id);
  *e.mutable_register_worker() = w.registration;
  Send(w, std::move(e));
  ++registers_sent;
  // The next retry: register_retry, doubling to register_retry_max, +-25%.
  w.register_backoff = w.register_backoff.count() == 0
                           ? options.register_retry
                           : std::min(options.register_retry_max, w.register_backoff * 2);
  std::uniform_real_distribution<double> jitter(0.75, 1.25);
  w.next_register =
      now + std::chrono::duration_cast<Clock::duration>(w.register_backoff * jitter(w.shard->rng));
}

void SimFleet::Impl::SendHeartbeat(Worker& w, Clock::time_point now) {
  control::Envelope e;
  *e.mutable_heartbeat() = w.heartbeat;
  Send(w, std::move(e));
  ++heartbeats_sent;
  w.next_heartbeat = now + w.heartbeat_interval;
}

void SimFleet::Impl::Schedule(Shard& s, Clock::time_point due, std::function<void()> fn) {
  s.timers.push(Timer{due, s.next_order++, std::move(fn)});
}

void SimFleet::Impl::Close(Worker& w) {
  if (w.dead) return;
  w.dead = true;
  w.registered = false;
  w.leader.reset();  // a crashed host's leader is gone with it
  // Disconnected, not closed: the loop still watches the socket (never
  // readable again), and its TCP connection ends as a crashed host's would.
  try {
    if (w.dealer) w.dealer->disconnect(options.coordinator_endpoint);
  } catch (const zmq::error_t& err) {
    TESSERA_LOG_WARN(kLog, "{}: disconnect failed: {}", w.requested_id, err.what());
  }
}

bool SimFleet::Impl::ReadFrames(Worker& w) {
  // At most 64 frames a turn, so one busy worker does not hold up its shard.
  for (int i = 0; i < 64; ++i) {
    if (w.dead) return true;  // disconnected: nothing more is read
    zmq::message_t msg;
    zmq::recv_result_t got;
    try {
      got = w.dealer->recv(msg, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& err) {
      TESSERA_LOG_WARN(kLog, "{}: recv failed: {}", w.requested_id, err.what());
      return false;
    }
    if (!got) return true;
    StatusOr<control::Envelope> e = DecodeEnvelope(msg.to_string_view());
    if (!e.ok()) {
      TESSERA_LOG_WARN(kLog, "{}: dropped a frame: {}", w.requested_id, e.status().ToString());
      continue;
    }
    Handle(w, *e);
  }
  return w.dead;
}

void SimFleet::Impl::Handle(Worker& w, const control::Envelope& e) {
  const Clock::time_point now = Clock::now();
  if (e.has_register_ack()) {
    const control::RegisterAck& ack = e.register_ack();
    if (ack.accepted()) {
      if (w.registered) return;  // the ack of a retry
      w.registered = true;
      w.worker_id = ack.worker_id();
      w.register_backoff = std::chrono::milliseconds(0);
      w.heartbeat_interval =
          std::chrono::milliseconds(std::max<uint32_t>(1, ack.heartbeat_interval_ms()));
      w.next_heartbeat = now + w.heartbeat_interval;
      ScheduleTick(w, w.next_heartbeat);
      ++registered;
      if (!w.ever_registered) {
        w.ever_registered = true;
        if (++first_registrations == static_cast<int64_t>(workers.size()))
          all_registered_s = std::chrono::duration<double>(now - started).count();
      }
      return;
    }
    if (ack.reason().rfind(kRegisterAgainPrefix, 0) == 0) {
      // The coordinator no longer knows this worker: register again.
      w.registered = false;
      w.register_backoff = std::chrono::milliseconds(0);
      SendRegister(w, now);
      ScheduleTick(w, w.next_register);
      return;
    }
    ++refused;
    TESSERA_LOG_WARN(kLog, "{}: registration refused: {}", w.requested_id, ack.reason());
    w.next_register = now + options.register_retry_max;
    ScheduleTick(w, w.next_register);
    return;
  }
  if (!w.registered) return;
  if (e.has_assign_shard()) return OnAssign(w, e.assign_shard());
  if (e.has_step()) return OnStep(w, e.step());
  if (e.has_generate() || e.has_cancel_requests()) {
    if (w.leader) w.leader->Post(e);
    return;
  }
  if (e.has_drain()) {
    w.leader.reset();
    w.heartbeat.set_state(control::WORKER_STATE_DRAINING);
    SendHeartbeat(w, now);
    return;
  }
  if (e.has_shutdown()) return Close(w);
}

void SimFleet::Impl::OnAssign(Worker& w, const control::AssignShard& a) {
  const Clock::time_point now = Clock::now();
  const double load_s = options.model->LoadSeconds(
      a, w.registration.has_held_shard() ? &w.registration.held_shard() : nullptr);
  w.leader.reset();  // a new plan ends the old one's
  w.assign = a;
  w.has_assign = true;
  ++assigned;
  w.heartbeat.set_state(control::WORKER_STATE_LOADING);
  w.heartbeat.set_plan_version(a.plan_version());
  SendHeartbeat(w, now);
  const bool sampler = a.stage() + 1 == std::max<uint32_t>(1, a.pp()) && a.tp_rank() == 0;
  if (sampler) {
    std::lock_guard<std::mutex> lock(plans_mu);
    plans[a.plan_version()] = Plan{&w, {}};
  }
  const uint64_t bytes = static_cast<uint64_t>(options.model->ShardBytes(a));
  const uint64_t version = a.plan_version();
  Schedule(*w.shard,
           now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(load_s)),
           [this, &w, version, bytes, load_s] {
             if (w.dead || !w.has_assign || w.assign.plan_version() != version) return;
             control::Envelope p;
             control::LoadProgress* lp = p.mutable_load_progress();
             lp->set_plan_version(version);
             lp->set_bytes_done(bytes);
             lp->set_bytes_total(bytes);
             lp->set_seconds(load_s);
             Send(w, std::move(p));
             control::Envelope e;
             control::Loaded* l = e.mutable_loaded();
             l->set_plan_version(version);
             l->set_weights_bytes(bytes);
             l->set_kv_capacity_blocks(w.assign.kv_num_blocks());
             l->set_load_seconds(load_s);
             Send(w, std::move(e));
             if (w.assign.has_leader()) StartLeader(w);
             ++loaded;
             *w.registration.mutable_held_shard() = w.assign;
             w.heartbeat.set_state(control::WORKER_STATE_READY);
             w.heartbeat.clear_memory();
             control::DeviceMemory* m = w.heartbeat.add_memory();
             m->set_device_index(static_cast<uint32_t>(w.gpu));
             m->set_weights_bytes(bytes);
             SendHeartbeat(w, Clock::now());
           });
}

void SimFleet::Impl::StartLeader(Worker& w) {
  Shard* shard = w.shard;
  auto leader = SimLeader::Start(
      w.assign, options.model, options.token_lo, options.token_hi,
      [this, shard, &w](control::Envelope e) {
        shard->loop.Post([this, &w, e = std::move(e)]() mutable { Send(w, std::move(e)); });
      },
      &steps, &tokens);
  if (!leader.ok()) {
    TESSERA_LOG_ERROR(kLog, "{}: cannot lead its replica: {}", w.requested_id,
                      leader.status().ToString());
    return;
  }
  w.leader = std::move(*leader);
}

void SimFleet::Impl::OnStep(Worker& w, const control::Step& step) {
  if (!w.has_assign || w.assign.stage() != 0 || w.assign.tp_rank() != 0) return;
  if (step.plan_version() != w.assign.plan_version()) return;
  const Clock::time_point now = Clock::now();
  control::Envelope e;
  control::StepResult* r = e.mutable_step_result();
  r->set_plan_version(step.plan_version());
  r->set_micro_batch_id(step.micro_batch_id());
  int64_t offset = 0;
  for (const control::SeqStep& s : step.batch().seqs()) {
    offset += s.num_tokens();
    if (!s.want_logits()) continue;
    control::SampledToken* t = r->add_tokens();
    t->set_seq_id(s.seq_id());
    t->set_token_id(
        TokenAt(s.seq_id(), s.start_pos() + s.num_tokens(), options.token_lo, options.token_hi));
    if (s.sampling().logprobs()) {
      t->set_has_logprobs(true);
      t->set_logprob(-0.5f);
      for (uint32_t k = 0; k < s.sampling().num_top_logprobs(); ++k) {
        control::TokenLogprob* top = t->add_top_logprobs();
        top->set_token_id(k == 0 ? t->token_id() : options.token_lo + static_cast<int32_t>(k));
        top->set_logprob(-0.5f - static_cast<float>(k));
      }
    }
  }
  (void)offset;
  const double step_s = options.model->StepSeconds(w.assign, step.batch());
  Worker* sampler = nullptr;
  Clock::time_point due =
      now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(step_s));
  {
    std::lock_guard<std::mutex> lock(plans_mu);
    auto it = plans.find(step.plan_version());
    if (it == plans.end()) return;  // no sampler assigned: the step is lost, as on a broken plan
    sampler = it->second.sampler;
    due = std::max(due, it->second.last_due);
    it->second.last_due = due;
  }
  const int64_t n = r->tokens_size();
  auto answer = [this, sampler, e = std::move(e), n]() mutable {
    if (sampler->dead) return;
    Send(*sampler, std::move(e));
    ++steps;
    tokens += n;
  };
  if (sampler->shard == w.shard) {
    Schedule(*w.shard, due, std::move(answer));
  } else {
    Shard* target = sampler->shard;
    target->loop.Post([this, target, due, answer = std::move(answer)]() mutable {
      Schedule(*target, due, std::move(answer));
    });
  }
}

void SimFleet::Impl::Scan(Shard& s) {
  const Clock::time_point now = Clock::now();
  while (!s.timers.empty() && s.timers.top().due <= now) {
    Timer t = s.timers.top();
    s.timers.pop();
    t.fn();
  }
}

void SimFleet::Impl::ScheduleTick(Worker& w, Clock::time_point due) {
  // Ticks fall on a 25 ms grid, so the heartbeats of a shard's hundreds of
  // workers go out in a few wake-ups a second, not one wake-up each.
  constexpr auto kGrid = std::chrono::milliseconds(25);
  const auto since = due.time_since_epoch();
  due = Clock::time_point((since + kGrid - Clock::duration(1)) / kGrid * kGrid);
  const uint64_t generation = ++w.tick_generation;
  Schedule(*w.shard, due, [this, &w, generation] {
    if (w.dead || w.tick_generation != generation) return;
    Tick(w);
  });
}

void SimFleet::Impl::Tick(Worker& w) {
  const Clock::time_point now = Clock::now();
  if (!w.registered) {
    SendRegister(w, now);
    ScheduleTick(w, w.next_register);
  } else {
    SendHeartbeat(w, now);
    ScheduleTick(w, w.next_heartbeat);
  }
}

SimFleet::SimFleet(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SimFleet::~SimFleet() { Stop(); }

std::string SimFleet::NodeName(int n) { return fmt::format("sim-{:04d}", n); }

int SimFleet::gpus_per_node() const { return static_cast<int>(impl_->options.node.gpus.size()); }

StatusOr<std::unique_ptr<SimFleet>> SimFleet::Start(FleetOptions options) {
  if (!options.model) return InvalidArgument("fleet: no step model");
  if (options.nodes < 1) return InvalidArgument("fleet: nodes must be >= 1");
  if (options.node.gpus.empty()) return InvalidArgument("fleet: the node's report has no GPU");
  if (options.token_lo < 0 || options.token_hi <= options.token_lo)
    return InvalidArgument("fleet: empty token range");
  const int gpus = static_cast<int>(options.node.gpus.size());
  const size_t total = static_cast<size_t>(options.nodes) * static_cast<size_t>(gpus);
  const bool curve = !options.coordinator_public_key.empty();
  if (curve && options.worker_secret_keys.size() != total)
    return InvalidArgument(fmt::format("fleet: {} worker secret keys for {} workers",
                                       options.worker_secret_keys.size(), total));
  auto impl = std::make_unique<Impl>(std::move(options));
  Impl& f = *impl;
  const int shards = std::max(1, std::min<int>(f.options.shards, static_cast<int>(total)));
  for (int i = 0; i < shards; ++i) f.shards.push_back(std::make_unique<Shard>(i));
  for (int n = 0; n < f.options.nodes; ++n) {
    TopologyReport report = f.options.node;
    report.hostname = NodeName(n);
    for (GpuInfo& g : report.gpus) g.uuid = fmt::format("GPU-sim-{:04d}-{}", n, g.index);
    const std::string topology_json = TopologyReportToJson(report, -1);
    for (int g = 0; g < gpus; ++g) {
      auto w = std::make_unique<Worker>();
      w->index = n * gpus + g;
      w->node = n;
      w->gpu = report.gpus[static_cast<size_t>(g)].index;
      // A node's workers share a shard: a Step to a stage's tp ranks (one
      // node) wakes one thread, not eight.
      w->shard = f.shards[static_cast<size_t>(n % shards)].get();
      w->requested_id = fmt::format("{}-g{}", report.hostname, w->gpu);
      w->routing_id = "w-" + w->requested_id;
      const GpuInfo& gpu = report.gpus[static_cast<size_t>(g)];
      control::Register& reg = w->registration;
      reg.set_host(report.hostname);
      reg.set_pid(static_cast<uint32_t>(100000 + w->index));
      reg.set_build_version(TESSERA_VERSION);
      reg.set_data_address(fmt::format("10.{}.{}.{}", (n >> 8) & 255, n & 255, 1 + g));
      control::Device* dev = reg.add_devices();
      dev->set_index(static_cast<uint32_t>(gpu.index));
      dev->set_kind(control::DEVICE_KIND_CUDA);
      dev->set_name(gpu.name);
      dev->set_uuid(gpu.uuid);
      dev->set_total_memory_bytes(static_cast<uint64_t>(gpu.memory_total_bytes));
      dev->set_free_memory_bytes(static_cast<uint64_t>(gpu.memory_total_bytes));
      dev->set_compute_capability(static_cast<uint32_t>(gpu.cc_major * 10 + gpu.cc_minor));
      dev->set_pci_bus_id(gpu.pci_bus_id);
      dev->set_numa_node(gpu.numa_node);
      reg.mutable_topology()->set_source("file");
      reg.set_topology_json(topology_json);
      w->heartbeat.set_state(control::WORKER_STATE_IDLE);
      if (curve) {
        w->curve_secret = f.options.worker_secret_keys[static_cast<size_t>(w->index)];
        StatusOr<std::string> pub = CurvePublicKey(w->curve_secret);
        if (!pub.ok()) return pub.status().WithContext("worker " + w->requested_id);
        w->curve_public = *pub;
      }
      try {
        w->dealer = std::make_unique<zmq::socket_t>(f.context, zmq::socket_type::dealer);
        w->dealer->set(zmq::sockopt::routing_id, w->routing_id);
        if (curve) {
          w->dealer->set(zmq::sockopt::curve_serverkey, f.options.coordinator_public_key);
          w->dealer->set(zmq::sockopt::curve_publickey, w->curve_public);
          w->dealer->set(zmq::sockopt::curve_secretkey, w->curve_secret);
        }
        w->dealer->set(zmq::sockopt::linger, 0);
        w->dealer->set(zmq::sockopt::reconnect_ivl, 100);
        w->dealer->set(zmq::sockopt::reconnect_ivl_max, 2000);
        w->dealer->connect(f.options.coordinator_endpoint);
      } catch (const zmq::error_t& err) {
        return IoError(fmt::format("worker {}: cannot connect to '{}': {}", w->requested_id,
                                   f.options.coordinator_endpoint, err.what()));
      }
      w->slot = w->shard->workers.size();
      w->shard->workers.push_back(w.get());
      f.workers.push_back(std::move(w));
    }
  }
  f.started = Clock::now();
  for (auto& sp : f.shards) {
    Shard& s = *sp;
    // Every worker registers at once: the storm a fleet-wide restart makes.
    for (Worker* w : s.workers) f.ScheduleTick(*w, f.started);
    EpollShardLoop::Hooks hooks;
    for (Worker* w : s.workers) hooks.sockets.push_back(w->dealer.get());
    hooks.on_readable = [&f, &s](size_t slot) { return f.ReadFrames(*s.workers[slot]); };
    hooks.next_due = [&s] {
      return s.timers.empty() ? Clock::time_point::max() : s.timers.top().due;
    };
    hooks.run_due = [&f, &s] { f.Scan(s); };
    hooks.on_exit = [&s] {
      for (Worker* w : s.workers)
        if (w->dealer) w->dealer->close();
    };
    TESSERA_RETURN_IF_ERROR(s.loop.Start(std::move(hooks)));
  }
  return std::unique_ptr<SimFleet>(new SimFleet(std::move(impl)));
}

FleetStats SimFleet::stats() const {
  const Impl& f = *impl_;
  FleetStats s;
  s.workers = static_cast<int64_t>(f.workers.size());
  s.registered = f.registered;
  s.refused = f.refused;
  s.registers_sent = f.registers_sent;
  s.heartbeats_sent = f.heartbeats_sent;
  s.assigned = f.assigned;
  s.loaded = f.loaded;
  s.steps = f.steps;
  s.tokens = f.tokens;
  s.killed = f.killed;
  s.seconds_to_all_registered = f.all_registered_s;
  return s;
}

void SimFleet::KillNode(int n) {
  Impl& f = *impl_;
  const int gpus = gpus_per_node();
  if (n < 0 || n >= f.options.nodes) return;
  for (int g = 0; g < gpus; ++g) {
    Worker* w = f.workers[static_cast<size_t>(n * gpus + g)].get();
    w->shard->loop.Post([&f, w] {
      if (w->dead) return;
      f.Close(*w);
      ++f.killed;
    });
  }
}

void SimFleet::Stop() {
  for (auto& s : impl_->shards) s->loop.Stop();
}

}  // namespace tessera::fleet_sim
