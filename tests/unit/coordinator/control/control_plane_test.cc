// Control plane: the Envelope codec's validation rules, and the ControlServer
// / ControlClient pair over real ZeroMQ sockets on tcp://127.0.0.1.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/wire/control_codec.h"
#include "coordinator/control/control_server.h"
#include "worker/daemon/control_client.h"

namespace tessera {
namespace {

using control::Envelope;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Valid messages of every body.

Envelope Wrap(const std::string& worker_id) {
  Envelope e;
  e.set_protocol_version(kControlProtocolVersion);
  e.set_worker_id(worker_id);
  e.set_seq(1);
  return e;
}

control::Register ValidRegisterBody() {
  control::Register r;
  r.set_host("host-a");
  r.set_pid(4242);
  r.set_build_version("0.1.0");
  r.set_data_address("127.0.0.1");
  for (uint32_t i = 0; i < 2; ++i) {
    control::Device* d = r.add_devices();
    d->set_index(i);
    d->set_name("NVIDIA H200");
    d->set_uuid("GPU-" + std::to_string(i));
    d->set_total_memory_bytes(uint64_t{141} << 30);
    d->set_free_memory_bytes(uint64_t{140} << 30);
    d->set_kind(control::DEVICE_KIND_CUDA);
    d->set_compute_capability(90);
    d->set_numa_node(0);
  }
  control::TopologyReport* t = r.mutable_topology();
  control::DevicePair* p = t->add_device_pairs();
  p->set_device_a(0);
  p->set_device_b(1);
  p->set_path(control::LINK_PATH_NVLINK);
  p->set_nvlink_count(18);
  t->add_pcie_links()->set_device_index(1);
  control::NumaNode* n = t->add_numa_nodes();
  n->set_id(0);
  n->add_device_indices(0);
  n->add_device_indices(1);
  control::Nic* nic = t->add_nics();
  nic->set_name("eth0");
  nic->add_addresses("10.0.0.7");
  return r;
}

Envelope ValidRegister() {
  Envelope e = Wrap("");
  *e.mutable_register_worker() = ValidRegisterBody();
  return e;
}

Envelope ValidAck() {
  Envelope e = Wrap("w1");
  control::RegisterAck* a = e.mutable_register_ack();
  a->set_accepted(true);
  a->set_worker_id("w1");
  a->set_heartbeat_interval_ms(1000);
  a->set_heartbeat_miss_limit(3);
  return e;
}

Envelope ValidHeartbeat(const std::string& worker_id = "w1") {
  Envelope e = Wrap(worker_id);
  control::Heartbeat* h = e.mutable_heartbeat();
  h->set_state(control::WORKER_STATE_READY);
  h->set_plan_version(3);
  control::DeviceMemory* m = h->add_memory();
  m->set_device_index(0);
  m->set_used_bytes(100);
  m->set_total_bytes(1000);
  return e;
}

Envelope ValidAssignShard() {
  Envelope e = Wrap("w1");
  control::AssignShard* a = e.mutable_assign_shard();
  a->set_plan_version(3);
  a->set_tp(2);
  a->set_pp(2);
  a->add_layers_per_stage(3);
  a->add_layers_per_stage(2);
  a->set_stage(1);
  a->set_tp_rank(1);
  a->set_world_rank(3);
  a->set_first_layer(3);
  a->set_end_layer(5);
  a->set_model_path("/models/smollm2");
  a->set_dtype("BF16");
  a->set_kv_block_size(16);
  a->set_kv_num_blocks(100);
  control::GlooRendezvous* g = a->mutable_gloo();
  g->set_store_host("127.0.0.1");
  g->set_store_port(29500);
  g->set_store_key(std::string(32, 'k'));
  g->set_key_prefix("plan-3/");
  return e;
}

Envelope ValidLoadProgress() {
  Envelope e = Wrap("w1");
  control::LoadProgress* p = e.mutable_load_progress();
  p->set_plan_version(3);
  p->set_bytes_done(10);
  p->set_bytes_total(20);
  p->set_seconds(0.5);
  return e;
}

Envelope ValidLoaded() {
  Envelope e = Wrap("w1");
  control::Loaded* l = e.mutable_loaded();
  l->set_plan_version(3);
  l->set_weights_bytes(1 << 20);
  l->set_kv_capacity_blocks(64);
  l->set_load_seconds(1.25);
  return e;
}

StepBatch ValidBatch() {
  StepBatch b;
  b.token_ids = {11, 12, 13, 14};
  SeqStep a;
  a.seq_id = 7;
  a.start_pos = 0;
  a.num_tokens = 3;
  a.block_table = {0};
  a.want_logits = true;
  a.sampling.temperature = 0.7f;
  a.sampling.top_k = 40;
  a.sampling.top_p = 0.9f;
  a.sampling.seed = 1234;
  a.sampling.logprobs = 5;
  SeqStep d;
  d.seq_id = 8;
  d.start_pos = 16;
  d.num_tokens = 1;
  d.block_table = {1, 2};
  d.want_logits = true;
  b.seqs = {a, d};
  b.finished_seq_ids = {5};
  return b;
}

Envelope ValidStep() {
  Envelope e = Wrap("w1");
  control::Step* s = e.mutable_step();
  s->set_plan_version(3);
  s->set_micro_batch_id(9);
  StepBatchToProto(ValidBatch(), s->mutable_batch());
  return e;
}

Envelope ValidStepResult() {
  Envelope e = Wrap("w1");
  control::StepResult* r = e.mutable_step_result();
  r->set_plan_version(3);
  r->set_micro_batch_id(9);
  control::SampledToken* t = r->add_tokens();
  t->set_seq_id(7);
  t->set_token_id(5);
  t->set_has_logprobs(true);
  t->set_logprob(-0.5f);
  control::TokenLogprob* top = t->add_top_logprobs();
  top->set_token_id(5);
  top->set_logprob(-0.5f);
  top = t->add_top_logprobs();
  top->set_token_id(6);
  top->set_logprob(-1.5f);
  r->add_tokens()->set_seq_id(8);  // token 0, logprob 0: allowed
  return e;
}

Envelope ValidError() {
  Envelope e = Wrap("w1");
  e.mutable_error()->set_code(control::ERROR_CODE_UNAVAILABLE);
  e.mutable_error()->set_message("rank 3 is gone");
  e.mutable_error()->set_in_reply_to_seq(17);
  return e;
}

// Stages of different tp: tp = [2, 1]; world rank 2 is stage 1's tp rank 0.
Envelope ValidPerStageAssignShard() {
  Envelope e = ValidAssignShard();
  control::AssignShard* a = e.mutable_assign_shard();
  a->set_tp(0);
  a->add_tp_per_stage(2);
  a->add_tp_per_stage(1);
  a->set_stage(1);
  a->set_tp_rank(0);
  a->set_world_rank(2);
  return e;
}

std::vector<Envelope> EveryValidBody() {
  Envelope drain = Wrap("w1");
  drain.mutable_drain()->set_reason("re-plan");
  Envelope shutdown = Wrap("w1");
  shutdown.mutable_shutdown()->set_graceful(true);
  Envelope refused = Wrap("");
  refused.mutable_register_ack()->set_reason("worker_id 'w1' is held");
  return {ValidRegister(),
          ValidAck(),
          refused,
          ValidHeartbeat(),
          ValidAssignShard(),
          ValidLoadProgress(),
          ValidLoaded(),
          ValidStep(),
          ValidStepResult(),
          drain,
          shutdown,
          ValidError()};
}

// ---------------------------------------------------------------------------
// Codec.

TEST(ControlCodec, EveryBodyRoundTrips) {
  std::vector<Envelope> all = EveryValidBody();
  ASSERT_EQ(all.size(), 12u);
  for (const Envelope& e : all) {
    SCOPED_TRACE(EnvelopeBodyName(e));
    StatusOr<std::string> bytes = EncodeEnvelope(e);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    StatusOr<Envelope> back = DecodeEnvelope(*bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(e, *back));
  }
  Envelope none = Wrap("w1");
  EXPECT_STREQ(EnvelopeBodyName(none), "none");
}

TEST(ControlCodec, RejectsUnknownVersionsNamingThem) {
  for (uint32_t v : {0u, kControlProtocolVersion + 1, 99u}) {
    Envelope e = ValidHeartbeat();
    e.set_protocol_version(v);
    StatusOr<Envelope> d = DecodeEnvelope(e.SerializeAsString());
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(d.status().message().find("protocol_version " + std::to_string(v)), std::string::npos)
        << d.status().ToString();
    EXPECT_EQ(EncodeEnvelope(e).status().code(), StatusCode::kUnimplemented);
  }
  // Empty bytes parse as an Envelope with version 0.
  EXPECT_EQ(DecodeEnvelope("").status().code(), StatusCode::kUnimplemented);
}

TEST(ControlCodec, RejectsBytesThatAreNotAnEnvelope) {
  const std::string garbage(12, '\xff');  // an unterminated varint tag
  StatusOr<Envelope> d = DecodeEnvelope(garbage);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("12 bytes is not a valid protobuf Envelope"),
            std::string::npos)
      << d.status().ToString();
  // A valid message cut short is also rejected.
  std::string bytes = ValidAssignShard().SerializeAsString();
  EXPECT_FALSE(DecodeEnvelope(bytes.substr(0, bytes.size() - 3)).ok());
}

TEST(ControlCodec, RejectsEmptyBody) {
  Envelope e = Wrap("w1");
  StatusOr<Envelope> d = DecodeEnvelope(e.SerializeAsString());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("no body"), std::string::npos);
}

TEST(ControlCodec, EnforcesTheSizeLimitBothWays) {
  Envelope e = ValidStep();
  const std::string bytes = e.SerializeAsString();
  StatusOr<Envelope> d = DecodeEnvelope(bytes, bytes.size() - 1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(
      d.status().message().find(std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                                std::to_string(bytes.size() - 1)),
      std::string::npos)
      << d.status().ToString();
  EXPECT_TRUE(DecodeEnvelope(bytes, bytes.size()).ok());
  StatusOr<std::string> enc = EncodeEnvelope(e, bytes.size() - 1);
  ASSERT_FALSE(enc.ok());
  EXPECT_EQ(enc.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(enc.status().message().find("step: message of"), std::string::npos);
}

TEST(ControlCodec, PerStageAssignShardIsValidAndRoundTrips) {
  const Envelope e = ValidPerStageAssignShard();
  ASSERT_TRUE(ValidateEnvelope(e).ok()) << ValidateEnvelope(e).ToString();
  Envelope back;
  ASSERT_TRUE(back.ParseFromString(e.SerializeAsString()));
  EXPECT_EQ(back.assign_shard().tp_per_stage_size(), 2);
  EXPECT_EQ(back.assign_shard().tp_per_stage(0), 2u);
  EXPECT_EQ(back.assign_shard().tp_per_stage(1), 1u);
  // Stage 0's tp rank 1 of tp = [2, 1] is world rank 1.
  Envelope first = e;
  first.mutable_assign_shard()->set_stage(0);
  first.mutable_assign_shard()->set_tp_rank(1);
  first.mutable_assign_shard()->set_world_rank(1);
  first.mutable_assign_shard()->set_first_layer(0);
  first.mutable_assign_shard()->set_end_layer(3);
  EXPECT_TRUE(ValidateEnvelope(first).ok()) << ValidateEnvelope(first).ToString();
}

TEST(ControlCodec, WorkerIdRules) {
  EXPECT_TRUE(IsValidWorkerId("worker-0"));
  EXPECT_TRUE(IsValidWorkerId("host.a:gpu_7@rack-2"));
  EXPECT_FALSE(IsValidWorkerId(""));
  EXPECT_FALSE(IsValidWorkerId("has space"));
  EXPECT_FALSE(IsValidWorkerId("slash/y"));
  EXPECT_FALSE(IsValidWorkerId(std::string(kMaxWorkerIdBytes + 1, 'a')));
  EXPECT_TRUE(IsValidWorkerId(std::string(kMaxWorkerIdBytes, 'a')));
  // Register may ask for no id; a worker's other messages must carry one.
  EXPECT_TRUE(ValidateEnvelope(ValidRegister()).ok());
  Envelope named = ValidRegister();
  named.set_worker_id("bad id");
  EXPECT_FALSE(ValidateEnvelope(named).ok());
}

struct InvalidCase {
  const char* name;
  std::function<Envelope()> base;
  std::function<void(Envelope&)> mutate;
  StatusCode code;
  std::string expect;  // substring of the message
};

std::vector<InvalidCase> InvalidCases() {
  const StatusCode kIA = StatusCode::kInvalidArgument;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto reg = [](Envelope& e) { return e.mutable_register_worker(); };
  auto ack = [](Envelope& e) { return e.mutable_register_ack(); };
  auto hb = [](Envelope& e) { return e.mutable_heartbeat(); };
  auto as = [](Envelope& e) { return e.mutable_assign_shard(); };
  auto seq = [](Envelope& e, int i) { return e.mutable_step()->mutable_batch()->mutable_seqs(i); };
  auto res = [](Envelope& e) { return e.mutable_step_result(); };
  auto nccl = [](Envelope& e) {
    control::NcclRendezvous* n = e.mutable_assign_shard()->mutable_nccl();
    n->set_world_unique_id(std::string(kNcclUniqueIdBytes, 'x'));
    n->set_tp_group_unique_id(std::string(kNcclUniqueIdBytes, 'y'));
    return n;
  };
  return {
      // Envelope.
      {"no worker_id", [] { return ValidHeartbeat(); }, [](Envelope& e) { e.clear_worker_id(); },
       kIA, "heartbeat: worker_id is empty"},
      {"bad worker_id", [] { return ValidHeartbeat(); },
       [](Envelope& e) { e.set_worker_id("a b"); }, kIA,
       "heartbeat: worker_id is not 1..128 bytes"},
      {"long worker_id", [] { return ValidHeartbeat(); },
       [](Envelope& e) { e.set_worker_id(std::string(129, 'a')); }, kIA, "worker_id is not"},
      // Register.
      {"empty host", ValidRegister, [=](Envelope& e) { reg(e)->clear_host(); }, kIA,
       "register_worker: host is empty"},
      {"no devices", ValidRegister, [=](Envelope& e) { reg(e)->clear_devices(); }, kIA,
       "devices is empty"},
      {"duplicate device", ValidRegister,
       [=](Envelope& e) { reg(e)->mutable_devices(1)->set_index(0); }, kIA,
       "devices[1]: device index 0 is listed twice"},
      {"free > total", ValidRegister,
       [=](Envelope& e) { reg(e)->mutable_devices(0)->set_free_memory_bytes(uint64_t{142} << 30); },
       kIA, "devices[0]: free_memory_bytes"},
      {"unspecified kind", ValidRegister,
       [=](Envelope& e) { reg(e)->mutable_devices(0)->set_kind(control::DEVICE_KIND_UNSPECIFIED); },
       kIA, "devices[0]: kind 0 is unspecified or unknown"},
      {"unknown kind", ValidRegister,
       [=](Envelope& e) {
         reg(e)->mutable_devices(1)->set_kind(static_cast<control::DeviceKind>(7));
       },
       kIA, "devices[1]: kind 7"},
      {"pair names a missing device", ValidRegister,
       [=](Envelope& e) { reg(e)->mutable_topology()->mutable_device_pairs(0)->set_device_b(5); },
       kIA, "topology.device_pairs[0].device_b: device index 5 is not in devices"},
      {"unknown link path", ValidRegister,
       [=](Envelope& e) {
         reg(e)->mutable_topology()->mutable_device_pairs(0)->set_path(
             static_cast<control::LinkPath>(42));
       },
       kIA, "path 42 is not a known LinkPath"},
      {"pcie link names a missing device", ValidRegister,
       [=](Envelope& e) { reg(e)->mutable_topology()->mutable_pcie_links(0)->set_device_index(9); },
       kIA, "topology.pcie_links[0]: device index 9"},
      {"numa node names a missing device", ValidRegister,
       [=](Envelope& e) {
         reg(e)->mutable_topology()->mutable_numa_nodes(0)->add_device_indices(9);
       },
       kIA, "topology.numa_nodes[0].device_indices: device index 9"},
      // RegisterAck.
      {"accepted without id", ValidAck, [=](Envelope& e) { ack(e)->clear_worker_id(); }, kIA,
       "register_ack: accepted without a worker_id"},
      {"ack id differs", ValidAck, [=](Envelope& e) { ack(e)->set_worker_id("w2"); }, kIA,
       "worker_id 'w2' differs from the envelope's 'w1'"},
      {"ack interval 0", ValidAck, [=](Envelope& e) { ack(e)->set_heartbeat_interval_ms(0); }, kIA,
       "heartbeat_interval_ms 0"},
      {"refused without reason", ValidAck, [=](Envelope& e) { ack(e)->set_accepted(false); }, kIA,
       "rejected without a reason"},
      // Heartbeat.
      {"unspecified state", [] { return ValidHeartbeat(); },
       [=](Envelope& e) { hb(e)->set_state(control::WORKER_STATE_UNSPECIFIED); }, kIA,
       "heartbeat: state 0 is unspecified or unknown"},
      {"unknown state", [] { return ValidHeartbeat(); },
       [=](Envelope& e) { hb(e)->set_state(static_cast<control::WorkerState>(99)); }, kIA,
       "state 99"},
      {"used > total", [] { return ValidHeartbeat(); },
       [=](Envelope& e) { hb(e)->mutable_memory(0)->set_used_bytes(1001); }, kIA,
       "memory[0]: used_bytes 1001 exceeds total_bytes 1000"},
      // AssignShard.
      {"plan_version 0", ValidAssignShard, [=](Envelope& e) { as(e)->set_plan_version(0); }, kIA,
       "assign_shard: plan_version is 0"},
      {"tp 0", ValidAssignShard, [=](Envelope& e) { as(e)->set_tp(0); }, kIA, "tp is 0"},
      {"pp 0", ValidAssignShard, [=](Envelope& e) { as(e)->set_pp(0); }, kIA, "pp is 0"},
      {"layers_per_stage size", ValidAssignShard,
       [=](Envelope& e) { as(e)->mutable_layers_per_stage()->RemoveLast(); }, kIA,
       "layers_per_stage has 1 entries, pp is 2"},
      {"empty stage", ValidAssignShard, [=](Envelope& e) { as(e)->set_layers_per_stage(0, 0); },
       kIA, "layers_per_stage[0] is 0"},
      {"stage >= pp", ValidAssignShard, [=](Envelope& e) { as(e)->set_stage(2); }, kIA,
       "stage 2 is not below pp 2"},
      {"tp_rank >= tp", ValidAssignShard, [=](Envelope& e) { as(e)->set_tp_rank(2); }, kIA,
       "tp_rank 2 is not below tp 2"},
      {"world_rank", ValidAssignShard, [=](Envelope& e) { as(e)->set_world_rank(2); }, kIA,
       "world_rank 2 != stage * tp + tp_rank = 3"},
      {"layer range", ValidAssignShard, [=](Envelope& e) { as(e)->set_first_layer(2); }, kIA,
       "layer range [2, 5) is not stage 1's [3, 5)"},
      {"layer end", ValidAssignShard, [=](Envelope& e) { as(e)->set_end_layer(6); }, kIA,
       "layer range [3, 6)"},
      {"model_path", ValidAssignShard, [=](Envelope& e) { as(e)->clear_model_path(); }, kIA,
       "model_path is empty"},
      {"integer dtype", ValidAssignShard, [=](Envelope& e) { as(e)->set_dtype("I32"); }, kIA,
       "dtype 'I32' is not one of F32, F16, BF16"},
      {"unknown dtype", ValidAssignShard, [=](Envelope& e) { as(e)->set_dtype("fp8"); }, kIA,
       "dtype 'fp8'"},
      {"kv_block_size 0", ValidAssignShard, [=](Envelope& e) { as(e)->set_kv_block_size(0); }, kIA,
       "kv_block_size is 0"},
      {"kv_num_blocks 0", ValidAssignShard, [=](Envelope& e) { as(e)->set_kv_num_blocks(0); }, kIA,
       "kv_num_blocks is 0"},
      {"no rendezvous", ValidAssignShard, [=](Envelope& e) { as(e)->clear_gloo(); }, kIA,
       "no rendezvous"},
      {"gloo host", ValidAssignShard,
       [=](Envelope& e) { as(e)->mutable_gloo()->clear_store_host(); }, kIA,
       "gloo.store_host is empty"},
      {"gloo port 0", ValidAssignShard,
       [=](Envelope& e) { as(e)->mutable_gloo()->set_store_port(0); }, kIA,
       "gloo.store_port 0 is not in 1..65535"},
      {"gloo port too big", ValidAssignShard,
       [=](Envelope& e) { as(e)->mutable_gloo()->set_store_port(70000); }, kIA,
       "gloo.store_port 70000"},
      {"gloo prefix", ValidAssignShard,
       [=](Envelope& e) { as(e)->mutable_gloo()->clear_key_prefix(); }, kIA,
       "gloo.key_prefix is empty"},
      {"gloo store key", ValidAssignShard,
       [=](Envelope& e) { as(e)->mutable_gloo()->set_store_key("short"); }, kIA,
       "gloo.store_key has 5 bytes, expected 32"},
      {"nccl world id", ValidAssignShard,
       [=](Envelope& e) { nccl(e)->set_world_unique_id(std::string(16, 'x')); }, kIA,
       "nccl.world_unique_id has 16 bytes, expected 128"},
      {"tp with tp_per_stage", ValidPerStageAssignShard, [=](Envelope& e) { as(e)->set_tp(2); },
       kIA, "tp is 2 but tp_per_stage is set (tp must be 0)"},
      {"tp_per_stage size", ValidPerStageAssignShard,
       [=](Envelope& e) { as(e)->add_tp_per_stage(1); }, kIA,
       "tp_per_stage has 3 entries, pp is 2"},
      {"tp_per_stage 0", ValidPerStageAssignShard,
       [=](Envelope& e) { as(e)->set_tp_per_stage(0, 0); }, kIA, "tp_per_stage[0] is 0"},
      {"tp_rank >= stage tp", ValidPerStageAssignShard,
       [=](Envelope& e) {
         as(e)->set_tp_rank(1);
         as(e)->set_world_rank(3);
       },
       kIA, "tp_rank 1 is not below stage 1's tp 1"},
      {"per-stage world_rank", ValidPerStageAssignShard,
       [=](Envelope& e) { as(e)->set_world_rank(1); }, kIA,
       "world_rank 1 != tp of stages before 1 + tp_rank = 2"},
      {"tp_per_stage overflow", ValidPerStageAssignShard,
       [=](Envelope& e) {
         as(e)->set_tp_per_stage(0, 2'000'000'000);
         as(e)->set_tp_per_stage(1, 2'000'000'000);
       },
       kIA, "tp_per_stage sums to more than 2147483647 ranks"},
      {"nccl tp id", ValidAssignShard, [=](Envelope& e) { nccl(e)->clear_tp_group_unique_id(); },
       kIA, "nccl.tp_group_unique_id has 0 bytes"},
      // LoadProgress / Loaded.
      {"progress plan 0", ValidLoadProgress,
       [](Envelope& e) { e.mutable_load_progress()->set_plan_version(0); }, kIA,
       "load_progress: plan_version is 0"},
      {"progress past total", ValidLoadProgress,
       [](Envelope& e) { e.mutable_load_progress()->set_bytes_done(21); }, kIA,
       "bytes_done 21 exceeds bytes_total 20"},
      {"progress negative seconds", ValidLoadProgress,
       [](Envelope& e) { e.mutable_load_progress()->set_seconds(-1); }, kIA,
       "seconds -1.000000 is not a finite value >= 0"},
      {"progress NaN seconds", ValidLoadProgress,
       [=](Envelope& e) { e.mutable_load_progress()->set_seconds(nan); }, kIA, "seconds"},
      {"loaded plan 0", ValidLoaded, [](Envelope& e) { e.mutable_loaded()->set_plan_version(0); },
       kIA, "loaded: plan_version is 0"},
      {"loaded infinite seconds", ValidLoaded,
       [=](Envelope& e) { e.mutable_loaded()->set_load_seconds(inf); }, kIA, "load_seconds inf"},
      // Step.
      {"step plan 0", ValidStep, [](Envelope& e) { e.mutable_step()->set_plan_version(0); }, kIA,
       "step: plan_version is 0"},
      {"step without seqs", ValidStep,
       [](Envelope& e) { e.mutable_step()->mutable_batch()->clear_seqs(); }, kIA,
       "batch.seqs is empty"},
      {"negative token", ValidStep,
       [](Envelope& e) { e.mutable_step()->mutable_batch()->set_token_ids(1, -1); }, kIA,
       "batch.token_ids[1] is -1"},
      {"num_tokens 0", ValidStep, [=](Envelope& e) { seq(e, 1)->set_num_tokens(0); }, kIA,
       "batch.seqs[1] (seq_id 8): num_tokens 0 < 1"},
      {"negative start_pos", ValidStep, [=](Envelope& e) { seq(e, 0)->set_start_pos(-1); }, kIA,
       "batch.seqs[0] (seq_id 7): start_pos -1 < 0"},
      {"position overflow", ValidStep,
       [=](Envelope& e) { seq(e, 1)->set_start_pos(std::numeric_limits<int32_t>::max()); }, kIA,
       "start_pos + num_tokens overflows int32"},
      {"duplicate seq_id", ValidStep, [=](Envelope& e) { seq(e, 1)->set_seq_id(7); }, kIA,
       "batch.seqs[1] (seq_id 7): seq_id appears twice"},
      {"empty block table", ValidStep, [=](Envelope& e) { seq(e, 0)->clear_block_table(); }, kIA,
       "block_table is empty"},
      {"negative block", ValidStep, [=](Envelope& e) { seq(e, 1)->set_block_table(1, -2); }, kIA,
       "batch.seqs[1] (seq_id 8): block_table[1] is -2"},
      {"negative temperature", ValidStep,
       [=](Envelope& e) { seq(e, 0)->mutable_sampling()->set_temperature(-1); }, kIA,
       "batch.seqs[0] (seq_id 7): sampling: temperature must be >= 0"},
      {"NaN temperature", ValidStep,
       [=](Envelope& e) { seq(e, 0)->mutable_sampling()->set_temperature(nan); }, kIA,
       "temperature"},
      {"negative top_k", ValidStep,
       [=](Envelope& e) { seq(e, 0)->mutable_sampling()->set_top_k(-3); }, kIA,
       "sampling: top_k must be >= 0, got -3"},
      {"top_p 0", ValidStep, [=](Envelope& e) { seq(e, 1)->mutable_sampling()->set_top_p(0); }, kIA,
       "sampling: top_p must be in (0, 1]"},
      {"top_p > 1", ValidStep, [=](Envelope& e) { seq(e, 0)->mutable_sampling()->set_top_p(1.5f); },
       kIA, "top_p must be in (0, 1], got 1.5"},
      {"too many logprobs", ValidStep,
       [=](Envelope& e) { seq(e, 0)->mutable_sampling()->set_num_top_logprobs(21); }, kIA,
       "num_top_logprobs 21 exceeds 20"},
      {"top logprobs without logprobs", ValidStep,
       [=](Envelope& e) { seq(e, 0)->mutable_sampling()->set_logprobs(false); }, kIA,
       "batch.seqs[0] (seq_id 7): sampling: num_top_logprobs 5 is set but logprobs is false"},
      {"token count mismatch", ValidStep,
       [](Envelope& e) { e.mutable_step()->mutable_batch()->add_token_ids(5); }, kIA,
       "batch.seqs num_tokens sum to 4 but batch.token_ids has 5 tokens"},
      // StepResult.
      {"result plan 0", ValidStepResult, [=](Envelope& e) { res(e)->set_plan_version(0); }, kIA,
       "step_result: plan_version is 0"},
      {"error with tokens", ValidStepResult,
       [=](Envelope& e) {
         res(e)->mutable_error()->set_code(control::ERROR_CODE_INTERNAL);
         res(e)->mutable_error()->set_message("x");
       },
       kIA, "error is set together with 2 tokens"},
      {"bad nested error", ValidStepResult,
       [=](Envelope& e) {
         res(e)->clear_tokens();
         res(e)->mutable_error()->set_message("x");
       },
       kIA, "step_result: error: code 0 is unspecified or unknown"},
      {"negative sampled token", ValidStepResult,
       [=](Envelope& e) { res(e)->mutable_tokens(1)->set_token_id(-4); }, kIA,
       "tokens[1] (seq_id 8): token_id -4 < 0"},
      {"NaN logprob", ValidStepResult,
       [=](Envelope& e) { res(e)->mutable_tokens(0)->set_logprob(nan); }, kIA,
       "tokens[0] (seq_id 7): logprob nan is NaN or > 0"},
      {"positive logprob", ValidStepResult,
       [=](Envelope& e) { res(e)->mutable_tokens(0)->set_logprob(0.25f); }, kIA,
       "logprob 0.250000 is NaN or > 0"},
      {"too many top logprobs", ValidStepResult,
       [=](Envelope& e) {
         for (int i = 0; i < 19; ++i)
           res(e)->mutable_tokens(0)->add_top_logprobs()->set_logprob(-1);
       },
       kIA, "21 top_logprobs exceed 20"},
      {"bad top logprob token", ValidStepResult,
       [=](Envelope& e) { res(e)->mutable_tokens(0)->mutable_top_logprobs(1)->set_token_id(-1); },
       kIA, "tokens[0] (seq_id 7).top_logprobs[1]: token_id -1 < 0"},
      {"positive top logprob", ValidStepResult,
       [=](Envelope& e) { res(e)->mutable_tokens(0)->mutable_top_logprobs(0)->set_logprob(1); },
       kIA, "top_logprobs[0]: logprob 1.000000"},
      {"logprobs without has_logprobs", ValidStepResult,
       [=](Envelope& e) { res(e)->mutable_tokens(0)->set_has_logprobs(false); }, kIA,
       "tokens[0] (seq_id 7): logprob or top_logprobs set without has_logprobs"},
      {"logprob without has_logprobs", ValidStepResult,
       [=](Envelope& e) { res(e)->mutable_tokens(1)->set_logprob(-2); }, kIA,
       "tokens[1] (seq_id 8): logprob or top_logprobs set without has_logprobs"},
      // Error.
      {"error code 0", ValidError,
       [](Envelope& e) { e.mutable_error()->set_code(control::ERROR_CODE_UNSPECIFIED); }, kIA,
       "error: code 0 is unspecified or unknown"},
      {"unknown error code", ValidError,
       [](Envelope& e) { e.mutable_error()->set_code(static_cast<control::ErrorCode>(77)); }, kIA,
       "code 77"},
      {"empty error message", ValidError, [](Envelope& e) { e.mutable_error()->clear_message(); },
       kIA, "error: message is empty"},
  };
}

TEST(ControlCodec, EveryValidationRuleNamesTheField) {
  for (const InvalidCase& c : InvalidCases()) {
    SCOPED_TRACE(c.name);
    Envelope e = c.base();
    ASSERT_TRUE(ValidateEnvelope(e).ok()) << "base message is invalid";
    c.mutate(e);
    Status st = ValidateEnvelope(e);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    EXPECT_NE(st.message().find(c.expect), std::string::npos)
        << "message: " << st.message() << "\nexpected to contain: " << c.expect;
    // The decoder and the encoder apply the same rules.
    StatusOr<Envelope> d = DecodeEnvelope(e.SerializeAsString());
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().message(), st.message());
    EXPECT_FALSE(EncodeEnvelope(e).ok());
  }
}

TEST(ControlCodec, StepBatchConversionRoundTrips) {
  StepBatch b = ValidBatch();
  control::StepBatch m;
  StepBatchToProto(b, &m);
  StatusOr<StepBatch> back = StepBatchFromProto(m);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->token_ids, b.token_ids);
  EXPECT_EQ(back->finished_seq_ids, b.finished_seq_ids);
  ASSERT_EQ(back->seqs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back->seqs[i].seq_id, b.seqs[i].seq_id);
    EXPECT_EQ(back->seqs[i].start_pos, b.seqs[i].start_pos);
    EXPECT_EQ(back->seqs[i].num_tokens, b.seqs[i].num_tokens);
    EXPECT_EQ(back->seqs[i].block_table, b.seqs[i].block_table);
    EXPECT_EQ(back->seqs[i].want_logits, b.seqs[i].want_logits);
    EXPECT_EQ(back->seqs[i].sampling.temperature, b.seqs[i].sampling.temperature);
    EXPECT_EQ(back->seqs[i].sampling.top_k, b.seqs[i].sampling.top_k);
    EXPECT_EQ(back->seqs[i].sampling.top_p, b.seqs[i].sampling.top_p);
    EXPECT_EQ(back->seqs[i].sampling.seed, b.seqs[i].sampling.seed);
    EXPECT_EQ(back->seqs[i].sampling.logprobs, b.seqs[i].sampling.logprobs);
  }
  EXPECT_TRUE(m.seqs(0).sampling().logprobs());
  EXPECT_EQ(m.seqs(0).sampling().num_top_logprobs(), 5u);
  EXPECT_FALSE(m.seqs(1).sampling().logprobs());  // -1: not requested
  EXPECT_EQ(back->seqs[1].sampling.logprobs, -1);
  EXPECT_EQ(back->Positions(), b.Positions());
  m.mutable_seqs(0)->set_num_tokens(2);
  StatusOr<StepBatch> bad = StepBatchFromProto(m);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sum to 3 but batch.token_ids has 4"), std::string::npos)
      << bad.status().ToString();
}

TEST(ControlCodec, StatusAndErrorMapOneToOne) {
  for (StatusCode code :
       {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange,
        StatusCode::kUnimplemented, StatusCode::kFailedPrecondition, StatusCode::kIoError,
        StatusCode::kDeadlineExceeded, StatusCode::kUnavailable, StatusCode::kResourceExhausted,
        StatusCode::kInternal}) {
    Status st(code, std::string("rank 2: ") + StatusCodeName(code));
    control::Error e = StatusToError(st, 5);
    EXPECT_EQ(e.in_reply_to_seq(), 5u);
    Status back = ErrorToStatus(e);
    EXPECT_EQ(back.code(), code);
    EXPECT_EQ(back.message(), st.message());
  }
  control::Error unknown;
  unknown.set_code(static_cast<control::ErrorCode>(55));
  unknown.set_message("m");
  EXPECT_EQ(ErrorToStatus(unknown).code(), StatusCode::kInternal);
}

// ---------------------------------------------------------------------------
// Server and client over real sockets.

// Polls `pred` every 2 ms until it holds or `timeout` passes.
bool WaitUntil(const std::function<bool()>& pred, milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return pred();
}

// What the server's callbacks saw.
struct ServerLog {
  std::mutex mu;
  std::vector<std::pair<ControlPeer, Envelope>> messages;
  std::vector<Clock::time_point> received;  // when each of messages arrived
  std::vector<std::pair<std::string, Clock::time_point>> lost;
  std::vector<std::pair<ControlPeer, Status>> drops;

  size_t Count(Envelope::BodyCase body) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (const auto& m : messages) n += m.second.body_case() == body;
    return n;
  }
  size_t Drops() {
    std::lock_guard<std::mutex> lock(mu);
    return drops.size();
  }
  size_t Lost() {
    std::lock_guard<std::mutex> lock(mu);
    return lost.size();
  }
  std::optional<Envelope> Last(Envelope::BodyCase body) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = messages.rbegin(); it != messages.rend(); ++it)
      if (it->second.body_case() == body) return it->second;
    return std::nullopt;
  }
};

ControlServerOptions ServerOptions(ServerLog* log, milliseconds interval, int misses = 3) {
  ControlServerOptions o;
  o.heartbeat_interval = interval;
  o.heartbeat_miss_limit = misses;
  o.linger = milliseconds(0);
  o.on_message = [log](const ControlPeer& p, const Envelope& e) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->messages.emplace_back(p, e);
    log->received.push_back(Clock::now());
  };
  o.on_worker_lost = [log](const std::string& id) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->lost.emplace_back(id, Clock::now());
  };
  o.on_dropped = [log](const ControlPeer& p, const Status& s) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->drops.emplace_back(p, s);
  };
  return o;
}

// What a client's callbacks saw.
struct ClientLog {
  std::mutex mu;
  std::vector<Envelope> messages;
  std::vector<Status> drops;

  size_t Count(Envelope::BodyCase body) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (const auto& m : messages) n += m.body_case() == body;
    return n;
  }
  size_t Drops() {
    std::lock_guard<std::mutex> lock(mu);
    return drops.size();
  }
};

ControlClientOptions ClientOptions(ClientLog* log) {
  ControlClientOptions o;
  o.linger = milliseconds(0);
  o.register_retry = milliseconds(100);
  o.reconnect_interval = milliseconds(20);
  o.reconnect_interval_max = milliseconds(100);
  o.on_message = [log](const Envelope& e) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->messages.push_back(e);
  };
  o.on_dropped = [log](const Status& s) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->drops.push_back(s);
  };
  return o;
}

// A bare DEALER socket, for sending what a well-behaved client never would.
class RawDealer {
 public:
  RawDealer(const std::string& endpoint, const std::string& routing_id)
      : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::routing_id, routing_id);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  void Send(const std::string& bytes) {
    zmq::message_t m(bytes.data(), bytes.size());
    socket_.send(m, zmq::send_flags::none);
  }
  void SendTwoFrames(const std::string& a, const std::string& b) {
    zmq::message_t ma(a.data(), a.size()), mb(b.data(), b.size());
    socket_.send(ma, zmq::send_flags::sndmore);
    socket_.send(mb, zmq::send_flags::none);
  }
  std::optional<Envelope> Recv(milliseconds timeout) {
    zmq_pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    zmq::message_t m;
    if (!socket_.recv(m, zmq::recv_flags::none)) return std::nullopt;
    StatusOr<Envelope> d = DecodeEnvelope(m.to_string_view());
    if (!d.ok()) return std::nullopt;
    return *d;
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

std::string Serialize(const Envelope& e) { return e.SerializeAsString(); }

TEST(ControlPlane, RegisterAndAckRoundTrip) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  EXPECT_EQ(endpoint->rfind("tcp://127.0.0.1:", 0), 0u) << *endpoint;
  EXPECT_NE(endpoint->back(), '*');

  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "worker-0");
  EXPECT_TRUE(client.registered());
  EXPECT_EQ(client.worker_id(), "worker-0");
  ASSERT_TRUE(
      WaitUntil([&] { return clog.Count(Envelope::kRegisterAck) == 1; }, milliseconds(1000)));
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    const control::RegisterAck& ack = clog.messages[0].register_ack();
    EXPECT_TRUE(ack.accepted());
    EXPECT_EQ(ack.heartbeat_interval_ms(), 1000u);
    EXPECT_EQ(ack.heartbeat_miss_limit(), 3u);
  }
  // The coordinator side saw the Register once, under the assigned id.
  ASSERT_TRUE(
      WaitUntil([&] { return slog.Count(Envelope::kRegisterWorker) == 1; }, milliseconds(1000)));
  std::optional<Envelope> reg = slog.Last(Envelope::kRegisterWorker);
  EXPECT_EQ(reg->worker_id(), "worker-0");
  EXPECT_EQ(reg->register_worker().host(), "host-a");
  EXPECT_EQ(reg->register_worker().devices_size(), 2);
  std::vector<ControlWorkerInfo> workers = server.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id, "worker-0");
  EXPECT_EQ(workers[0].identity, client.routing_id());
  EXPECT_TRUE(workers[0].alive);
  EXPECT_EQ(workers[0].registration.pid(), 4242u);

  // A second worker gets the id it asks for; a third asking for the same id
  // is refused with the reason.
  ClientLog clog2, clog3;
  ControlClient named(ClientOptions(&clog2));
  ASSERT_TRUE(named.Connect(*endpoint).ok());
  ASSERT_TRUE(named.Register(ValidRegisterBody(), "gpu-a").ok());
  StatusOr<std::string> named_id = named.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(named_id.ok()) << named_id.status().ToString();
  EXPECT_EQ(*named_id, "gpu-a");
  ControlClient twin(ClientOptions(&clog3));
  ASSERT_TRUE(twin.Connect(*endpoint).ok());
  ASSERT_TRUE(twin.Register(ValidRegisterBody(), "gpu-a").ok());
  StatusOr<std::string> refused = twin.WaitRegistered(milliseconds(3000));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("worker_id 'gpu-a' is held by live peer " +
                                            named.routing_id()),
            std::string::npos)
      << refused.status().ToString();
  EXPECT_FALSE(twin.registered());
  EXPECT_EQ(twin.Send(ValidLoaded()).code(), StatusCode::kFailedPrecondition);
  const ControlServerStats st = server.stats();
  EXPECT_EQ(st.registrations_accepted, 2u);
  EXPECT_EQ(st.registrations_refused, 1u);
}

TEST(ControlPlane, RegisterRefusedByTheHook) {
  ServerLog slog;
  ControlServerOptions o = ServerOptions(&slog, milliseconds(1000));
  o.accept_register = [](const ControlPeer&, const control::Register& r) {
    if (r.build_version() != TESSERA_VERSION)
      return FailedPrecondition("worker build " + r.build_version() + " != coordinator build " +
                                TESSERA_VERSION);
    return Status::Ok();
  };
  ControlServer server(std::move(o));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  control::Register r = ValidRegisterBody();
  r.set_build_version("0.0.1-old");
  ASSERT_TRUE(client.Register(r).ok());
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("worker build 0.0.1-old != coordinator build"),
            std::string::npos)
      << id.status().ToString();
  EXPECT_TRUE(server.Workers().empty());
  EXPECT_EQ(slog.Count(Envelope::kRegisterWorker), 0u);
}

TEST(ControlPlane, HeartbeatsKeepAWorkerAlive) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(50), 4));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  control::Heartbeat hb;
  hb.set_state(control::WORKER_STATE_READY);
  hb.set_plan_version(5);
  hb.set_rss_bytes(123456);
  client.SetHeartbeat(hb);
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  ASSERT_TRUE(client.WaitRegistered(milliseconds(3000)).ok());
  // Three times the 200 ms loss window.
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(slog.Lost(), 0u);
  const size_t beats = slog.Count(Envelope::kHeartbeat);
  EXPECT_GE(beats, 6u) << "600 ms at a 50 ms interval";
  EXPECT_LE(beats, 16u);
  std::optional<Envelope> last = slog.Last(Envelope::kHeartbeat);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->worker_id(), "worker-0");
  EXPECT_EQ(last->heartbeat().state(), control::WORKER_STATE_READY);
  EXPECT_EQ(last->heartbeat().plan_version(), 5u);
  EXPECT_EQ(last->heartbeat().rss_bytes(), 123456u);
  std::vector<ControlWorkerInfo> workers = server.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_TRUE(workers[0].alive);
  EXPECT_LT(workers[0].seconds_since_last_message, 0.2);
  EXPECT_GE(client.stats().heartbeats_sent, beats);
}

TEST(ControlPlane, SilentWorkerIsReportedLostWithinTheTimeout) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(50), 4));  // lost after 200 ms
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog_a, clog_b;
  ControlClient stays(ClientOptions(&clog_a));
  ControlClient leaves(ClientOptions(&clog_b));
  ASSERT_TRUE(stays.Connect(*endpoint).ok());
  ASSERT_TRUE(leaves.Connect(*endpoint).ok());
  ASSERT_TRUE(stays.Register(ValidRegisterBody(), "stays").ok());
  ASSERT_TRUE(leaves.Register(ValidRegisterBody(), "leaves").ok());
  ASSERT_TRUE(stays.WaitRegistered(milliseconds(3000)).ok());
  ASSERT_TRUE(leaves.WaitRegistered(milliseconds(3000)).ok());
  std::this_thread::sleep_for(milliseconds(150));
  ASSERT_EQ(slog.Lost(), 0u);

  const Clock::time_point stopped = Clock::now();
  leaves.Stop();
  ASSERT_TRUE(WaitUntil([&] { return slog.Lost() >= 1; }, milliseconds(3000)));
  std::pair<std::string, Clock::time_point> lost;
  Clock::time_point last_heard;
  {
    std::lock_guard<std::mutex> lock(slog.mu);
    lost = slog.lost[0];
    for (size_t i = 0; i < slog.messages.size(); ++i)
      if (slog.messages[i].first.worker_id == "leaves") last_heard = slog.received[i];
  }
  EXPECT_EQ(lost.first, "leaves");
  EXPECT_GT(lost.second, stopped);
  // Declared lost once 4 intervals passed since its last message, found by a
  // check that runs every 12 ms.
  const double silent = std::chrono::duration<double>(lost.second - last_heard).count();
  EXPECT_GE(silent, 0.2);
  EXPECT_LE(silent, 0.6);
  // Only that one; the other keeps heartbeating.
  std::this_thread::sleep_for(milliseconds(250));
  EXPECT_EQ(slog.Lost(), 1u);
  for (const ControlWorkerInfo& w : server.Workers()) EXPECT_EQ(w.alive, w.worker_id == "stays");
  Envelope drain;
  drain.mutable_drain()->set_reason("test");
  Status send = server.Send("leaves", drain);
  EXPECT_EQ(send.code(), StatusCode::kUnavailable) << send.ToString();
  EXPECT_EQ(server.stats().workers_lost, 1u);
  // A new worker may take over the lost one's id.
  ClientLog clog_c;
  ControlClient returns(ClientOptions(&clog_c));
  ASSERT_TRUE(returns.Connect(*endpoint).ok());
  ASSERT_TRUE(returns.Register(ValidRegisterBody(), "leaves").ok());
  StatusOr<std::string> again = returns.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(server.Send("leaves", drain).ok());
  EXPECT_TRUE(WaitUntil([&] { return clog_c.Count(Envelope::kDrain) == 1; }, milliseconds(2000)));
}

// A coordinator restart: the worker's client keeps its socket, the new
// server answers its heartbeats with "register again", and the client
// registers again by itself with the same id and its updated registration
// (the shard it holds).
TEST(ControlPlane, ClientRegistersAgainWithARestartedServer) {
  ServerLog first_log;
  auto first = std::make_unique<ControlServer>(ServerOptions(&first_log, milliseconds(50)));
  StatusOr<std::string> endpoint = first->Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  control::Register held = ValidRegisterBody();
  *held.mutable_held_shard() = ValidAssignShard().assign_shard();
  ASSERT_TRUE(client.UpdateRegistration(held).ok());
  first->Stop();
  first.reset();

  ServerLog second_log;
  ControlServer second(ServerOptions(&second_log, milliseconds(50)));
  StatusOr<std::string> again = second.Start(*endpoint);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return second_log.Count(Envelope::kRegisterWorker) == 1; },
                        milliseconds(5000)));
  const std::optional<Envelope> reg = second_log.Last(Envelope::kRegisterWorker);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->worker_id(), *id);
  EXPECT_TRUE(reg->register_worker().has_held_shard());
  EXPECT_EQ(reg->register_worker().held_shard().plan_version(),
            ValidAssignShard().assign_shard().plan_version());
  // Registered again: heartbeats are heard, and the worker can be addressed.
  ASSERT_TRUE(
      WaitUntil([&] { return second_log.Count(Envelope::kHeartbeat) >= 2; }, milliseconds(3000)));
  Envelope drain;
  drain.mutable_drain()->set_reason("test");
  EXPECT_TRUE(second.Send(*id, drain).ok());
  EXPECT_TRUE(WaitUntil([&] { return clog.Count(Envelope::kDrain) == 1; }, milliseconds(2000)));
}

TEST(ControlPlane, BadMessagesAreDroppedAndTheServerKeepsServing) {
  ServerLog slog;
  ControlServerOptions o = ServerOptions(&slog, milliseconds(1000));
  o.max_message_bytes = 4096;
  ControlServer server(std::move(o));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());

  RawDealer rogue(*endpoint, "rogue");
  auto wait_drops = [&](size_t n) {
    return WaitUntil([&] { return slog.Drops() >= n; }, milliseconds(2000));
  };
  rogue.Send(std::string(12, '\xff'));
  ASSERT_TRUE(wait_drops(1));
  Envelope future = ValidHeartbeat();
  future.set_protocol_version(99);
  rogue.Send(Serialize(future));
  ASSERT_TRUE(wait_drops(2));
  rogue.Send(Serialize(ValidLoaded()));  // valid, but rogue never registered
  ASSERT_TRUE(wait_drops(3));
  rogue.Send(std::string(5000, '\0'));  // over the 4096-byte limit
  ASSERT_TRUE(wait_drops(4));
  rogue.SendTwoFrames(Serialize(ValidLoaded()), "extra");
  ASSERT_TRUE(wait_drops(5));
  Envelope bad_register = ValidRegister();
  bad_register.mutable_register_worker()->clear_host();
  rogue.Send(Serialize(bad_register));
  ASSERT_TRUE(wait_drops(6));
  {
    std::lock_guard<std::mutex> lock(slog.mu);
    const std::vector<std::string> expect = {
        "12 bytes is not a valid protobuf Envelope",
        "protocol_version 99 is not supported",
        "loaded from a peer that is not registered (worker_id 'w1')",
        "message of 5000 bytes exceeds the limit of 4096 bytes",
        "expected 1 payload frame after the routing id, got 2",
        "register_worker: host is empty",
    };
    ASSERT_EQ(slog.drops.size(), expect.size());
    for (size_t i = 0; i < expect.size(); ++i) {
      EXPECT_EQ(slog.drops[i].first.identity, "rogue");
      EXPECT_NE(slog.drops[i].second.message().find(expect[i]), std::string::npos)
          << "drop " << i << ": " << slog.drops[i].second.ToString();
    }
    EXPECT_TRUE(slog.messages.empty());
  }
  ControlServerStats st = server.stats();
  EXPECT_EQ(st.dropped_malformed, 4u);
  EXPECT_EQ(st.dropped_version, 1u);
  EXPECT_EQ(st.dropped_unregistered, 1u);
  EXPECT_EQ(st.frames_received, 6u);
  EXPECT_TRUE(server.Workers().empty());

  // The server still serves: a good worker registers and is heard.
  ClientLog clog;
  ControlClient good(ClientOptions(&clog));
  ASSERT_TRUE(good.Connect(*endpoint).ok());
  ASSERT_TRUE(good.Register(ValidRegisterBody()).ok());
  StatusOr<std::string> id = good.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(good.Send(ValidLoaded()).ok());
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kLoaded) == 1; }, milliseconds(2000)));

  // A registered peer is still held to the rules: its own id only, only the
  // bodies a worker sends, and a repeated Register is answered without a
  // second registration.
  RawDealer peer(*endpoint, "raw-peer");
  peer.Send(Serialize(ValidRegister()));
  std::optional<Envelope> ack = peer.Recv(milliseconds(2000));
  ASSERT_TRUE(ack.has_value());
  ASSERT_TRUE(ack->register_ack().accepted());
  const std::string raw_id = ack->register_ack().worker_id();
  peer.Send(Serialize(ValidRegister()));
  std::optional<Envelope> ack2 = peer.Recv(milliseconds(2000));
  ASSERT_TRUE(ack2.has_value());
  EXPECT_EQ(ack2->register_ack().worker_id(), raw_id);
  EXPECT_GT(ack2->seq(), ack->seq());
  const size_t drops_before = slog.Drops();
  peer.Send(Serialize(ValidHeartbeat(*id)));  // the other worker's id
  Envelope step = ValidStep();
  step.set_worker_id(raw_id);
  peer.Send(Serialize(step));  // a coordinator -> worker body
  ASSERT_TRUE(wait_drops(drops_before + 2));
  {
    std::lock_guard<std::mutex> lock(slog.mu);
    EXPECT_NE(slog.drops[drops_before].second.message().find("heartbeat carries worker_id '" + *id +
                                                             "', but this peer registered as '" +
                                                             raw_id + "'"),
              std::string::npos)
        << slog.drops[drops_before].second.ToString();
    EXPECT_NE(
        slog.drops[drops_before + 1].second.message().find("step is not a message a worker sends"),
        std::string::npos);
  }
  peer.Send(Serialize(ValidHeartbeat(raw_id)));
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kHeartbeat) >= 1; }, milliseconds(2000)));
  EXPECT_EQ(slog.Count(Envelope::kRegisterWorker), 2u);  // good + raw-peer, once each
  EXPECT_EQ(server.stats().registrations_accepted, 2u);
}

TEST(ControlPlane, CoordinatorAndWorkerExchangeMessages) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClientOptions co = ClientOptions(&clog);
  // The worker answers an AssignShard with LoadProgress and Loaded from its
  // own thread (Send is legal inside the handler).
  ControlClient* self = nullptr;
  co.on_message = [&](const Envelope& e) {
    {
      std::lock_guard<std::mutex> lock(clog.mu);
      clog.messages.push_back(e);
    }
    if (e.has_assign_shard()) {
      Envelope p = ValidLoadProgress();
      p.mutable_load_progress()->set_plan_version(e.assign_shard().plan_version());
      EXPECT_TRUE(self->Send(p).ok());
      Envelope l = ValidLoaded();
      l.mutable_loaded()->set_plan_version(e.assign_shard().plan_version());
      EXPECT_TRUE(self->Send(l).ok());
    }
  };
  ControlClient client(std::move(co));
  self = &client;
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody(), "w1").ok());
  ASSERT_TRUE(client.WaitRegistered(milliseconds(3000)).ok());

  Envelope assign = ValidAssignShard();
  assign.clear_worker_id();
  assign.clear_seq();
  ASSERT_TRUE(server.Send("w1", assign).ok());
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kLoaded) == 1; }, milliseconds(2000)));
  EXPECT_EQ(slog.Count(Envelope::kLoadProgress), 1u);
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    ASSERT_EQ(clog.messages.size(), 2u);  // the ack, then the assignment
    const Envelope& got = clog.messages[1];
    EXPECT_EQ(got.worker_id(), "w1");
    EXPECT_EQ(got.assign_shard().world_rank(), 3u);
    EXPECT_EQ(got.assign_shard().gloo().key_prefix(), "plan-3/");
  }
  std::optional<Envelope> loaded = slog.Last(Envelope::kLoaded);
  EXPECT_EQ(loaded->loaded().plan_version(), 3u);
  EXPECT_EQ(loaded->worker_id(), "w1");

  // A Step out and its StepResult back, through StepBatch conversion.
  Envelope step = ValidStep();
  ASSERT_TRUE(server.Send("w1", step).ok());
  ASSERT_TRUE(WaitUntil([&] { return clog.Count(Envelope::kStep) == 1; }, milliseconds(2000)));
  Envelope got_step;
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    got_step = clog.messages.back();
  }
  StatusOr<StepBatch> batch = StepBatchFromProto(got_step.step().batch());
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->token_ids, ValidBatch().token_ids);
  Envelope result = ValidStepResult();
  result.mutable_step_result()->set_micro_batch_id(got_step.step().micro_batch_id());
  ASSERT_TRUE(client.Send(result).ok());
  ASSERT_TRUE(
      WaitUntil([&] { return slog.Count(Envelope::kStepResult) == 1; }, milliseconds(2000)));
  EXPECT_EQ(slog.Last(Envelope::kStepResult)->step_result().micro_batch_id(), 9u);

  // Sends the codec refuses, or to nobody, fail at the call.
  EXPECT_EQ(server.Send("nobody", step).code(), StatusCode::kNotFound);
  Envelope bad = ValidStep();
  bad.mutable_step()->set_plan_version(0);
  EXPECT_EQ(server.Send("w1", bad).code(), StatusCode::kInvalidArgument);
  Envelope bad_result = ValidStepResult();
  bad_result.mutable_step_result()->mutable_tokens(0)->set_token_id(-1);
  EXPECT_EQ(client.Send(bad_result).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(slog.Drops(), 0u);
  EXPECT_EQ(clog.Drops(), 0u);
}

TEST(ControlPlane, ClientDropsBadMessagesAndRetriesRegister) {
  // A hand-driven ROUTER plays the coordinator.
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  auto recv = [&](milliseconds timeout) -> std::optional<std::pair<std::string, Envelope>> {
    zmq_pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    zmq::message_t id, payload;
    EXPECT_TRUE(router.recv(id, zmq::recv_flags::none));
    EXPECT_TRUE(router.recv(payload, zmq::recv_flags::none));
    StatusOr<Envelope> d = DecodeEnvelope(payload.to_string_view());
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return std::make_pair(id.to_string(), d.ok() ? *d : Envelope());
  };
  auto send = [&](const std::string& id, const std::string& bytes) {
    zmq::message_t mi(id.data(), id.size()), mp(bytes.data(), bytes.size());
    router.send(mi, zmq::send_flags::sndmore);
    router.send(mp, zmq::send_flags::none);
  };

  ClientLog clog;
  ControlClient client(ClientOptions(&clog));  // register_retry 100 ms
  ASSERT_TRUE(client.Connect(endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody(), "w1").ok());
  // The first Register goes unanswered; the client sends it again.
  auto first = recv(milliseconds(2000));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->first, client.routing_id());
  EXPECT_EQ(first->second.worker_id(), "w1");
  EXPECT_TRUE(first->second.has_register_worker());
  const Clock::time_point t0 = Clock::now();
  auto second = recv(milliseconds(2000));
  ASSERT_TRUE(second.has_value());
  EXPECT_TRUE(second->second.has_register_worker());
  EXPECT_GT(second->second.seq(), first->second.seq());
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - t0).count(), 0.05);

  const std::string id = client.routing_id();
  Envelope drain = Wrap("w1");
  drain.mutable_drain()->set_reason("before registration");
  send(id, Serialize(drain));  // arrives before the ack: dropped
  send(id, std::string(12, '\xff'));
  Envelope ack = ValidAck();
  ack.mutable_register_ack()->set_heartbeat_interval_ms(30);
  send(id, Serialize(ack));
  StatusOr<std::string> wid = client.WaitRegistered(milliseconds(2000));
  ASSERT_TRUE(wid.ok()) << wid.status().ToString();
  EXPECT_EQ(*wid, "w1");
  Envelope other = Wrap("w2");
  other.mutable_drain()->set_reason("not yours");
  send(id, Serialize(other));
  Envelope heartbeat = ValidHeartbeat("w1");  // a worker -> coordinator body
  send(id, Serialize(heartbeat));
  Envelope future = Wrap("w1");
  future.set_protocol_version(2);
  future.mutable_shutdown();
  send(id, Serialize(future));
  drain.mutable_drain()->set_reason("now");
  send(id, Serialize(drain));
  ASSERT_TRUE(WaitUntil([&] { return clog.Count(Envelope::kDrain) == 1; }, milliseconds(2000)));
  EXPECT_EQ(clog.Count(Envelope::kRegisterAck), 1u);
  EXPECT_EQ(clog.Count(Envelope::kShutdown), 0u);
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    const std::vector<std::string> expect = {
        "drain arrived before this worker registered",
        "not a valid protobuf Envelope",
        "drain is addressed to worker 'w2', this is 'w1'",
        "heartbeat is not a message the coordinator sends",
        "protocol_version 2 is not supported",
    };
    ASSERT_EQ(clog.drops.size(), expect.size());
    for (size_t i = 0; i < expect.size(); ++i)
      EXPECT_NE(clog.drops[i].message().find(expect[i]), std::string::npos)
          << "drop " << i << ": " << clog.drops[i].ToString();
    EXPECT_EQ(clog.messages.back().drain().reason(), "now");
  }
  // Heartbeats flow at the interval the ack set, carrying the assigned id.
  int heartbeats = 0;
  while (heartbeats < 3) {
    auto m = recv(milliseconds(1000));
    ASSERT_TRUE(m.has_value());
    if (!m->second.has_heartbeat()) continue;  // a late Register retry
    EXPECT_EQ(m->second.worker_id(), "w1");
    EXPECT_EQ(m->second.heartbeat().state(), control::WORKER_STATE_IDLE);
    ++heartbeats;
  }
}

TEST(ControlPlane, WorkerStartedBeforeTheCoordinatorRegistersOnceItAppears) {
  // Find a free port by binding once, then release it.
  std::string endpoint;
  {
    ServerLog unused;
    ControlServer probe(ServerOptions(&unused, milliseconds(1000)));
    StatusOr<std::string> e = probe.Start("tcp://127.0.0.1:*");
    ASSERT_TRUE(e.ok());
    endpoint = *e;
  }
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  EXPECT_EQ(client.WaitRegistered(milliseconds(150)).status().code(),
            StatusCode::kDeadlineExceeded);
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(50)));
  StatusOr<std::string> bound = server.Start(endpoint);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kHeartbeat) >= 2; }, milliseconds(2000)));
  EXPECT_EQ(server.Workers().size(), 1u);
}

TEST(ControlPlane, StartAndConnectReportBadEndpoints) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> bad = server.Start("nonsense://here");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kIoError);
  EXPECT_NE(bad.status().message().find("'nonsense://here'"), std::string::npos);
  ControlServer taken_a(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> a = taken_a.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(a.ok());
  ControlServer taken_b(ServerOptions(&slog, milliseconds(1000)));
  EXPECT_EQ(taken_b.Start(*a).status().code(), StatusCode::kIoError);
  EXPECT_EQ(taken_a.Start("tcp://127.0.0.1:*").status().code(), StatusCode::kFailedPrecondition);
  ControlServer zero(ServerOptions(&slog, milliseconds(0)));
  EXPECT_EQ(zero.Start("tcp://127.0.0.1:*").status().code(), StatusCode::kInvalidArgument);

  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  Status c = client.Connect("tcp://");
  EXPECT_EQ(c.code(), StatusCode::kIoError) << c.ToString();
  ControlClient unconnected(ClientOptions(&clog));
  EXPECT_EQ(unconnected.Register(ValidRegisterBody()).code(), StatusCode::kFailedPrecondition);
  control::Register empty;
  ControlClient connected(ClientOptions(&clog));
  ASSERT_TRUE(connected.Connect(*a).ok());
  Status r = connected.Register(empty);
  EXPECT_EQ(r.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.message().find("register_worker: host is empty"), std::string::npos);
}

}  // namespace
}  // namespace tessera
