// The control-plane Envelope codec (common/wire/control_codec.h): every body
// round-trips, and every validation rule rejects a message naming the field.
// (Split from tests/unit/coordinator/control/control_plane_test.cc.)
#include "common/wire/control_codec.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/control_envelopes.h"

namespace tessera {
namespace {

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
      {"unknown quantization", ValidAssignShard,
       [=](Envelope& e) { as(e)->set_quantization("int4"); }, kIA,
       "quantization 'int4' is not \"\" or \"fp8\""},
      {"unknown kv_cache_dtype", ValidAssignShard,
       [=](Envelope& e) { as(e)->set_kv_cache_dtype("int8"); }, kIA,
       "kv_cache_dtype 'int8' is not \"\" or \"fp8\""},
      {"kv_block_size 0", ValidAssignShard, [=](Envelope& e) { as(e)->set_kv_block_size(0); }, kIA,
       "kv_block_size is 0"},
      {"kv_num_blocks 0", ValidAssignShard, [=](Envelope& e) { as(e)->set_kv_num_blocks(0); }, kIA,
       "kv_num_blocks is 0"},
      {"no rendezvous", ValidAssignShard, [=](Envelope& e) { as(e)->clear_gloo(); }, kIA,
       "no rendezvous"},
      {"tokens_to_leader off the last stage", ValidAssignShard,
       [=](Envelope& e) {
         control::AssignShard* a = as(e);
         a->set_stage(0);
         a->set_world_rank(1);
         a->set_first_layer(0);
         a->set_end_layer(3);
         a->set_tokens_to_leader(true);
       },
       kIA, "tokens_to_leader is set on stage 0 of pp 2"},
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
  SamplingParams& q = b.seqs[1].sampling;
  q.presence_penalty = 0.5f;
  q.frequency_penalty = -1.25f;
  q.repetition_penalty = 1.3f;
  q.min_p = 0.05f;
  q.min_tokens = 4;
  q.logit_bias = {{3, -100.0f}, {9, 2.5f}};
  q.min_tokens_blocked = {2, 7};
  b.seqs[1].output_start = 2;
  b.seqs[1].history.assign(static_cast<size_t>(b.seqs[1].start_pos), 6);
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
    const SamplingParams& x = back->seqs[i].sampling;
    const SamplingParams& y = b.seqs[i].sampling;
    EXPECT_EQ(x.presence_penalty, y.presence_penalty);
    EXPECT_EQ(x.frequency_penalty, y.frequency_penalty);
    EXPECT_EQ(x.repetition_penalty, y.repetition_penalty);
    EXPECT_EQ(x.min_p, y.min_p);
    EXPECT_EQ(x.min_tokens, y.min_tokens);
    EXPECT_EQ(x.logit_bias, y.logit_bias);
    EXPECT_EQ(x.min_tokens_blocked, y.min_tokens_blocked);
    EXPECT_EQ(back->seqs[i].output_start, b.seqs[i].output_start);
    EXPECT_EQ(back->seqs[i].history, b.seqs[i].history);
  }
  EXPECT_EQ(m.seqs(0).sampling().repetition_penalty(), 0.0f);  // 1 = off: left unset
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

// The tokens a last stage returns to its replica's leader (AssignShard.tokens_to_leader): one
// per want_logits sequence, with log-probabilities and prompt log-probabilities, back as sent.
TEST(ControlCodec, SampledTokensRoundTripThroughAStepResult) {
  StepBatch b;
  for (int64_t id : {7, 8, 9}) {
    SeqStep s;
    s.seq_id = id;
    s.want_logits = id != 8;
    b.seqs.push_back(s);
  }
  std::vector<SampledToken> sent(2);
  sent[0].token_id = 5;
  sent[0].has_logprobs = true;
  sent[0].logprob = -0.25f;
  sent[0].top = {{5, -0.25f}, {3, -2.0f}};
  SampledToken prompt;
  prompt.token_id = 4;
  prompt.has_logprobs = true;
  prompt.logprob = -1.5f;
  prompt.top = {{2, -0.5f}};
  sent[0].prompt_logprobs = {prompt};
  sent[1].token_id = kNonFiniteLogitsToken;
  control::StepResult r;
  SampledTokensToProto(b, sent, &r);
  ASSERT_EQ(r.tokens_size(), 2);
  EXPECT_EQ(r.tokens(0).seq_id(), 7);
  EXPECT_EQ(r.tokens(1).seq_id(), 9);
  StatusOr<std::vector<SampledToken>> back = SampledTokensFromProto(r, 2, 10);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)[0].token_id, 5);
  EXPECT_TRUE((*back)[0].has_logprobs);
  EXPECT_EQ((*back)[0].logprob, -0.25f);
  ASSERT_EQ((*back)[0].top.size(), 2u);
  EXPECT_EQ((*back)[0].top[1].token_id, 3);
  EXPECT_EQ((*back)[0].top[1].logprob, -2.0f);
  ASSERT_EQ((*back)[0].prompt_logprobs.size(), 1u);
  EXPECT_EQ((*back)[0].prompt_logprobs[0].token_id, 4);
  EXPECT_EQ((*back)[0].prompt_logprobs[0].logprob, -1.5f);
  EXPECT_EQ((*back)[0].prompt_logprobs[0].top.size(), 1u);
  EXPECT_EQ((*back)[1].token_id, kNonFiniteLogitsToken);
  EXPECT_FALSE((*back)[1].has_logprobs);
  // The count and the vocab are checked.
  StatusOr<std::vector<SampledToken>> short_count = SampledTokensFromProto(r, 3, 10);
  ASSERT_FALSE(short_count.ok());
  EXPECT_NE(short_count.status().message().find("2 tokens for 3 sampled sequences"),
            std::string::npos)
      << short_count.status().ToString();
  StatusOr<std::vector<SampledToken>> small_vocab = SampledTokensFromProto(r, 2, 4);
  ASSERT_FALSE(small_vocab.ok());
  EXPECT_NE(small_vocab.status().message().find("tokens[0] (seq_id 7): token_id 5 is outside"),
            std::string::npos)
      << small_vocab.status().ToString();
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

}  // namespace
}  // namespace tessera
