// Valid control-plane Envelopes of every body (common/wire/control.proto),
// for the codec tests (tests/unit/common/wire/control_codec_test.cc) and the
// ControlServer / ControlClient tests (tests/unit/coordinator/control/).
// Each passes ValidateEnvelope as built; tests break one field at a time.
#pragma once

#include <string>
#include <vector>

#include "common/wire/control_codec.h"

namespace tessera {

using control::Envelope;

inline Envelope Wrap(const std::string& worker_id) {
  Envelope e;
  e.set_protocol_version(kControlProtocolVersion);
  e.set_worker_id(worker_id);
  e.set_seq(1);
  return e;
}

inline control::Register ValidRegisterBody() {
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

inline Envelope ValidRegister() {
  Envelope e = Wrap("");
  *e.mutable_register_worker() = ValidRegisterBody();
  return e;
}

inline Envelope ValidAck() {
  Envelope e = Wrap("w1");
  control::RegisterAck* a = e.mutable_register_ack();
  a->set_accepted(true);
  a->set_worker_id("w1");
  a->set_heartbeat_interval_ms(1000);
  a->set_heartbeat_miss_limit(3);
  return e;
}

inline Envelope ValidHeartbeat(const std::string& worker_id = "w1") {
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

inline Envelope ValidAssignShard() {
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

inline Envelope ValidLoadProgress() {
  Envelope e = Wrap("w1");
  control::LoadProgress* p = e.mutable_load_progress();
  p->set_plan_version(3);
  p->set_bytes_done(10);
  p->set_bytes_total(20);
  p->set_seconds(0.5);
  return e;
}

inline Envelope ValidLoaded() {
  Envelope e = Wrap("w1");
  control::Loaded* l = e.mutable_loaded();
  l->set_plan_version(3);
  l->set_weights_bytes(1 << 20);
  l->set_kv_capacity_blocks(64);
  l->set_load_seconds(1.25);
  return e;
}

inline StepBatch ValidBatch() {
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

inline Envelope ValidStep() {
  Envelope e = Wrap("w1");
  control::Step* s = e.mutable_step();
  s->set_plan_version(3);
  s->set_micro_batch_id(9);
  StepBatchToProto(ValidBatch(), s->mutable_batch());
  return e;
}

inline Envelope ValidStepResult() {
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

inline Envelope ValidError() {
  Envelope e = Wrap("w1");
  e.mutable_error()->set_code(control::ERROR_CODE_UNAVAILABLE);
  e.mutable_error()->set_message("rank 3 is gone");
  e.mutable_error()->set_in_reply_to_seq(17);
  return e;
}

// Stages of different tp: tp = [2, 1]; world rank 2 is stage 1's tp rank 0.
inline Envelope ValidPerStageAssignShard() {
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

inline std::vector<Envelope> EveryValidBody() {
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

}  // namespace tessera
