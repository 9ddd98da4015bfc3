#include "common/wire/control_codec.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/sampled_token.h"
#include "common/base/sampling_params.h"
#include "common/model/parallel_rank.h"
#include "common/wire/control_codec_internal.h"
#include "common/wire/leader_messages.h"

namespace tessera {
namespace {

using control::Envelope;

// StatusToError / ErrorToStatus convert codes by value.
static_assert(static_cast<int>(StatusCode::kInvalidArgument) ==
              control::ERROR_CODE_INVALID_ARGUMENT);
static_assert(static_cast<int>(StatusCode::kNotFound) == control::ERROR_CODE_NOT_FOUND);
static_assert(static_cast<int>(StatusCode::kOutOfRange) == control::ERROR_CODE_OUT_OF_RANGE);
static_assert(static_cast<int>(StatusCode::kUnimplemented) == control::ERROR_CODE_UNIMPLEMENTED);
static_assert(static_cast<int>(StatusCode::kFailedPrecondition) ==
              control::ERROR_CODE_FAILED_PRECONDITION);
static_assert(static_cast<int>(StatusCode::kIoError) == control::ERROR_CODE_IO_ERROR);
static_assert(static_cast<int>(StatusCode::kDeadlineExceeded) ==
              control::ERROR_CODE_DEADLINE_EXCEEDED);
static_assert(static_cast<int>(StatusCode::kUnavailable) == control::ERROR_CODE_UNAVAILABLE);
static_assert(static_cast<int>(StatusCode::kResourceExhausted) ==
              control::ERROR_CODE_RESOURCE_EXHAUSTED);
static_assert(static_cast<int>(StatusCode::kInternal) == control::ERROR_CODE_INTERNAL);
static_assert(static_cast<int>(StatusCode::kDataLoss) == control::ERROR_CODE_DATA_LOSS);

std::string Num(uint64_t v) { return std::to_string(v); }
std::string SNum(int64_t v) { return std::to_string(v); }

std::string Idx(const char* list, size_t i) { return std::string(list) + "[" + Num(i) + "]"; }

Status ValidateDevices(const control::Register& reg, std::set<uint32_t>* indices) {
  if (reg.devices_size() == 0) return InvalidArgument("devices is empty (a worker offers >= 1)");
  for (int i = 0; i < reg.devices_size(); ++i) {
    const control::Device& d = reg.devices(i);
    const std::string at = Idx("devices", static_cast<size_t>(i));
    if (!indices->insert(d.index()).second)
      return InvalidArgument(at + ": device index " + Num(d.index()) + " is listed twice");
    if (d.free_memory_bytes() > d.total_memory_bytes())
      return InvalidArgument(at + ": free_memory_bytes " + Num(d.free_memory_bytes()) +
                             " exceeds total_memory_bytes " + Num(d.total_memory_bytes()));
    if (d.kind() == control::DEVICE_KIND_UNSPECIFIED || !control::DeviceKind_IsValid(d.kind()))
      return InvalidArgument(at + ": kind " + SNum(d.kind()) + " is unspecified or unknown");
  }
  return Status::Ok();
}

Status CheckDeviceRef(const std::set<uint32_t>& indices, uint32_t index, const std::string& at) {
  if (!indices.count(index))
    return InvalidArgument(at + ": device index " + Num(index) + " is not in devices");
  return Status::Ok();
}

Status ValidateAssignShard(const control::AssignShard& a);

Status ValidateRegister(const control::Register& reg) {
  if (reg.host().empty()) return InvalidArgument("host is empty");
  if (reg.has_held_shard())
    TESSERA_RETURN_IF_ERROR_CTX(ValidateAssignShard(reg.held_shard()), "held_shard");
  std::set<uint32_t> indices;
  TESSERA_RETURN_IF_ERROR(ValidateDevices(reg, &indices));
  const control::TopologyReport& topo = reg.topology();
  for (int i = 0; i < topo.device_pairs_size(); ++i) {
    const control::DevicePair& p = topo.device_pairs(i);
    const std::string at = "topology." + Idx("device_pairs", static_cast<size_t>(i));
    TESSERA_RETURN_IF_ERROR(CheckDeviceRef(indices, p.device_a(), at + ".device_a"));
    TESSERA_RETURN_IF_ERROR(CheckDeviceRef(indices, p.device_b(), at + ".device_b"));
    if (!control::LinkPath_IsValid(p.path()))
      return InvalidArgument(at + ": path " + SNum(p.path()) + " is not a known LinkPath");
  }
  for (int i = 0; i < topo.pcie_links_size(); ++i)
    TESSERA_RETURN_IF_ERROR(
        CheckDeviceRef(indices, topo.pcie_links(i).device_index(),
                       "topology." + Idx("pcie_links", static_cast<size_t>(i))));
  for (int i = 0; i < topo.numa_nodes_size(); ++i) {
    const control::NumaNode& n = topo.numa_nodes(i);
    for (int j = 0; j < n.device_indices_size(); ++j)
      TESSERA_RETURN_IF_ERROR(CheckDeviceRef(
          indices, n.device_indices(j),
          "topology." + Idx("numa_nodes", static_cast<size_t>(i)) + ".device_indices"));
  }
  return Status::Ok();
}

Status ValidateRegisterAck(const control::RegisterAck& ack, const std::string& envelope_worker) {
  if (ack.accepted()) {
    if (ack.worker_id().empty()) return InvalidArgument("accepted without a worker_id");
    if (ack.worker_id() != envelope_worker)
      return InvalidArgument("worker_id '" + ack.worker_id() + "' differs from the envelope's '" +
                             envelope_worker + "'");
    if (ack.heartbeat_interval_ms() == 0)
      return InvalidArgument("accepted with heartbeat_interval_ms 0");
  } else if (ack.reason().empty()) {
    return InvalidArgument("rejected without a reason");
  }
  return Status::Ok();
}

Status ValidateHeartbeat(const control::Heartbeat& hb) {
  if (hb.state() == control::WORKER_STATE_UNSPECIFIED || !control::WorkerState_IsValid(hb.state()))
    return InvalidArgument("state " + SNum(hb.state()) + " is unspecified or unknown");
  if (!std::isfinite(hb.step_compute_seconds()) || hb.step_compute_seconds() < 0)
    return InvalidArgument("step_compute_seconds " + std::to_string(hb.step_compute_seconds()) +
                           " is not a finite number >= 0");
  for (int i = 0; i < hb.memory_size(); ++i) {
    const control::DeviceMemory& m = hb.memory(i);
    if (m.total_bytes() > 0 && m.used_bytes() > m.total_bytes())
      return InvalidArgument(Idx("memory", static_cast<size_t>(i)) + ": used_bytes " +
                             Num(m.used_bytes()) + " exceeds total_bytes " + Num(m.total_bytes()));
  }
  return Status::Ok();
}

Status ValidateAssignShard(const control::AssignShard& a) {
  if (a.plan_version() == 0) return InvalidArgument("plan_version is 0");
  if (a.tp_per_stage_size() == 0 && a.tp() == 0) return InvalidArgument("tp is 0");
  if (a.pp() == 0) return InvalidArgument("pp is 0");
  // The tp of each stage (pp entries); world ranks by common/model/parallel_rank.h.
  std::vector<int> tps;
  if (a.tp_per_stage_size() > 0) {
    if (a.tp() != 0)
      return InvalidArgument("tp is " + Num(a.tp()) + " but tp_per_stage is set (tp must be 0)");
    if (static_cast<uint64_t>(a.tp_per_stage_size()) != a.pp())
      return InvalidArgument("tp_per_stage has " + SNum(a.tp_per_stage_size()) +
                             " entries, pp is " + Num(a.pp()));
    uint64_t world = 0;
    for (int s = 0; s < a.tp_per_stage_size(); ++s) {
      if (a.tp_per_stage(s) == 0)
        return InvalidArgument(Idx("tp_per_stage", static_cast<size_t>(s)) + " is 0");
      world += a.tp_per_stage(s);
      if (world > INT_MAX)
        return InvalidArgument("tp_per_stage sums to more than " + Num(INT_MAX) + " ranks");
      tps.push_back(static_cast<int>(a.tp_per_stage(s)));
    }
  }
  if (static_cast<uint64_t>(a.layers_per_stage_size()) != a.pp())
    return InvalidArgument("layers_per_stage has " + SNum(a.layers_per_stage_size()) +
                           " entries, pp is " + Num(a.pp()));
  uint64_t first = 0;
  for (int s = 0; s < a.layers_per_stage_size(); ++s) {
    if (a.layers_per_stage(s) == 0)
      return InvalidArgument(Idx("layers_per_stage", static_cast<size_t>(s)) +
                             " is 0 (every stage needs >= 1 layer)");
    if (static_cast<uint32_t>(s) < a.stage()) first += a.layers_per_stage(s);
  }
  if (a.stage() >= a.pp())
    return InvalidArgument("stage " + Num(a.stage()) + " is not below pp " + Num(a.pp()));
  if (tps.empty()) {
    if (a.tp_rank() >= a.tp())
      return InvalidArgument("tp_rank " + Num(a.tp_rank()) + " is not below tp " + Num(a.tp()));
    const uint64_t rank = uint64_t{a.stage()} * a.tp() + a.tp_rank();
    if (a.world_rank() != rank)
      return InvalidArgument("world_rank " + Num(a.world_rank()) +
                             " != stage * tp + tp_rank = " + Num(rank));
  } else {
    const int stage = static_cast<int>(a.stage());
    const uint32_t stage_tp = a.tp_per_stage(stage);
    if (a.tp_rank() >= stage_tp)
      return InvalidArgument("tp_rank " + Num(a.tp_rank()) + " is not below stage " +
                             Num(a.stage()) + "'s tp " + Num(stage_tp));
    const uint64_t rank =
        static_cast<uint64_t>(WorldRank(stage, static_cast<int>(a.tp_rank()), tps));
    if (a.world_rank() != rank)
      return InvalidArgument("world_rank " + Num(a.world_rank()) + " != tp of stages before " +
                             Num(a.stage()) + " + tp_rank = " + Num(rank));
  }
  const uint64_t end = first + a.layers_per_stage(static_cast<int>(a.stage()));
  if (a.first_layer() != first || a.end_layer() != end)
    return InvalidArgument("layer range [" + Num(a.first_layer()) + ", " + Num(a.end_layer()) +
                           ") is not stage " + Num(a.stage()) + "'s [" + Num(first) + ", " +
                           Num(end) + ") per layers_per_stage");
  if (a.model_path().empty()) return InvalidArgument("model_path is empty");
  StatusOr<DType> dtype = ParseDType(a.dtype());
  if (!dtype.ok() || (*dtype != DType::kF32 && *dtype != DType::kF16 && *dtype != DType::kBF16))
    return InvalidArgument("dtype '" + a.dtype() + "' is not one of F32, F16, BF16");
  if (!a.quantization().empty() && a.quantization() != "fp8")
    return InvalidArgument("quantization '" + a.quantization() + "' is not \"\" or \"fp8\"");
  if (!a.kv_cache_dtype().empty() && a.kv_cache_dtype() != "fp8")
    return InvalidArgument("kv_cache_dtype '" + a.kv_cache_dtype() + "' is not \"\" or \"fp8\"");
  if (a.kv_block_size() == 0) return InvalidArgument("kv_block_size is 0");
  if (a.kv_num_blocks() == 0) return InvalidArgument("kv_num_blocks is 0");
  if (a.tokens_to_leader() && (a.pp() < 2 || a.stage() + 1 != a.pp()))
    return InvalidArgument("tokens_to_leader is set on stage " + Num(a.stage()) + " of pp " +
                           Num(a.pp()) + " (only the last stage of a pp > 1 plan returns tokens)");
  switch (a.rendezvous_case()) {
    case control::AssignShard::kGloo: {
      const control::GlooRendezvous& g = a.gloo();
      if (g.store_host().empty()) return InvalidArgument("gloo.store_host is empty");
      if (g.store_port() == 0 || g.store_port() > 65535)
        return InvalidArgument("gloo.store_port " + Num(g.store_port()) + " is not in 1..65535");
      if (g.key_prefix().empty()) return InvalidArgument("gloo.key_prefix is empty");
      if (g.store_key().size() != 32)
        return InvalidArgument("gloo.store_key has " + Num(g.store_key().size()) +
                               " bytes, expected 32");
      break;
    }
    case control::AssignShard::kNccl: {
      const control::NcclRendezvous& n = a.nccl();
      if (n.world_unique_id().size() != kNcclUniqueIdBytes)
        return InvalidArgument("nccl.world_unique_id has " + Num(n.world_unique_id().size()) +
                               " bytes, expected " + Num(kNcclUniqueIdBytes));
      if (n.tp_group_unique_id().size() != kNcclUniqueIdBytes)
        return InvalidArgument("nccl.tp_group_unique_id has " + Num(n.tp_group_unique_id().size()) +
                               " bytes, expected " + Num(kNcclUniqueIdBytes));
      break;
    }
    case control::AssignShard::RENDEZVOUS_NOT_SET:
      return InvalidArgument("no rendezvous (gloo or nccl) is set");
  }
  return Status::Ok();
}

Status CheckSeconds(double seconds, const char* field) {
  if (!std::isfinite(seconds) || seconds < 0)
    return InvalidArgument(std::string(field) + " " + std::to_string(seconds) +
                           " is not a finite value >= 0");
  return Status::Ok();
}

SamplingParams SamplingFromProto(const control::SamplingParams& s) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p();
  p.seed = s.seed();
  p.logprobs = s.logprobs() ? static_cast<int32_t>(s.num_top_logprobs()) : -1;
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  p.min_p = s.min_p();
  p.min_tokens = s.min_tokens();
  p.logit_bias.reserve(static_cast<size_t>(s.logit_bias_size()));
  for (const control::LogitBias& b : s.logit_bias())
    p.logit_bias.emplace_back(b.token_id(), b.bias());
  p.min_tokens_blocked.assign(s.min_tokens_blocked().begin(), s.min_tokens_blocked().end());
  p.prompt_logprobs = s.prompt_logprobs() ? static_cast<int32_t>(s.num_prompt_top_logprobs()) : -1;
  // Validate() refuses a kind past kLark (the u32 is clamped so that it names one).
  p.grammar.kind = static_cast<GrammarKind>(std::min<uint32_t>(s.grammar_kind(), 255));
  p.grammar.schema = s.grammar_schema();
  return p;
}

void SamplingToProto(const SamplingParams& p, control::SamplingParams* m) {
  m->set_temperature(p.temperature);
  m->set_top_k(p.top_k);
  m->set_top_p(p.top_p);
  m->set_seed(p.seed);
  m->set_logprobs(p.logprobs >= 0);
  m->set_num_top_logprobs(static_cast<uint32_t>(std::max(p.logprobs, 0)));
  m->set_presence_penalty(p.presence_penalty);
  m->set_frequency_penalty(p.frequency_penalty);
  if (p.repetition_penalty != 1.0f) m->set_repetition_penalty(p.repetition_penalty);
  m->set_min_p(p.min_p);
  m->set_min_tokens(p.min_tokens);
  for (const auto& [id, bias] : p.logit_bias) {
    control::LogitBias* b = m->add_logit_bias();
    b->set_token_id(id);
    b->set_bias(bias);
  }
  m->mutable_min_tokens_blocked()->Add(p.min_tokens_blocked.begin(), p.min_tokens_blocked.end());
  m->set_prompt_logprobs(p.prompt_logprobs >= 0);
  m->set_num_prompt_top_logprobs(static_cast<uint32_t>(std::max(p.prompt_logprobs, 0)));
  m->set_grammar_kind(static_cast<uint32_t>(p.grammar.kind));
  m->set_grammar_schema(p.grammar.schema);
}

Status ValidateSampling(const control::SamplingParams& s) {
  SamplingParams p = SamplingFromProto(s);
  p.logprobs = -1;  // num_top_logprobs is checked below, with its own message
  if (s.num_prompt_top_logprobs() > static_cast<uint32_t>(kMaxTopLogprobs) ||
      (s.num_prompt_top_logprobs() > 0 && !s.prompt_logprobs()))
    return InvalidArgument("num_prompt_top_logprobs " + Num(s.num_prompt_top_logprobs()) +
                           " exceeds " + SNum(kMaxTopLogprobs) +
                           " or is set without prompt_logprobs");
  TESSERA_RETURN_IF_ERROR(p.Validate());
  if (s.num_top_logprobs() > static_cast<uint32_t>(kMaxTopLogprobs))
    return InvalidArgument("num_top_logprobs " + Num(s.num_top_logprobs()) + " exceeds " +
                           SNum(kMaxTopLogprobs));
  if (s.num_top_logprobs() > 0 && !s.logprobs())
    return InvalidArgument("num_top_logprobs " + Num(s.num_top_logprobs()) +
                           " is set but logprobs is false");
  return Status::Ok();
}

Status ValidateStepBatch(const control::StepBatch& b) {
  if (b.seqs_size() == 0) return InvalidArgument("batch.seqs is empty");
  for (int i = 0; i < b.token_ids_size(); ++i)
    if (b.token_ids(i) < 0)
      return InvalidArgument(Idx("batch.token_ids", static_cast<size_t>(i)) + " is " +
                             SNum(b.token_ids(i)) + " (< 0)");
  std::set<int64_t> seq_ids;
  int64_t total = 0;
  for (int i = 0; i < b.seqs_size(); ++i) {
    const control::SeqStep& s = b.seqs(i);
    const std::string at =
        Idx("batch.seqs", static_cast<size_t>(i)) + " (seq_id " + SNum(s.seq_id()) + ")";
    if (!seq_ids.insert(s.seq_id()).second)
      return InvalidArgument(at + ": seq_id appears twice in the batch");
    if (s.num_tokens() < 1)
      return InvalidArgument(at + ": num_tokens " + SNum(s.num_tokens()) + " < 1");
    if (s.start_pos() < 0)
      return InvalidArgument(at + ": start_pos " + SNum(s.start_pos()) + " < 0");
    if (int64_t{s.start_pos()} + s.num_tokens() > INT32_MAX)
      return InvalidArgument(at + ": start_pos + num_tokens overflows int32");
    if (s.block_table_size() == 0) return InvalidArgument(at + ": block_table is empty");
    for (int j = 0; j < s.block_table_size(); ++j)
      if (s.block_table(j) < 0)
        return InvalidArgument(at + ": block_table[" + SNum(j) + "] is " + SNum(s.block_table(j)) +
                               " (< 0)");
    TESSERA_RETURN_IF_ERROR_CTX(ValidateSampling(s.sampling()), at + ": sampling");
    if (s.want_prompt_logprobs() && (!s.want_logits() || !s.sampling().prompt_logprobs()))
      return InvalidArgument(at +
                             ": want_prompt_logprobs without want_logits and "
                             "sampling.prompt_logprobs");
    if (s.history_size() != 0 && s.history_size() != s.start_pos())
      return InvalidArgument(at + ": history of " + SNum(s.history_size()) +
                             " tokens for start_pos " + SNum(s.start_pos()));
    for (int j = 0; j < s.history_size(); ++j)
      if (s.history(j) < 0)
        return InvalidArgument(at + ": history[" + SNum(j) + "] is " + SNum(s.history(j)) +
                               " (< 0)");
    total += s.num_tokens();
  }
  if (total != b.token_ids_size())
    return InvalidArgument("batch.seqs num_tokens sum to " + SNum(total) +
                           " but batch.token_ids has " + SNum(b.token_ids_size()) + " tokens");
  return Status::Ok();
}

Status ValidateStep(const control::Step& step) {
  if (step.plan_version() == 0) return InvalidArgument("plan_version is 0");
  return ValidateStepBatch(step.batch());
}

Status ValidateError(const control::Error& e) {
  if (e.code() == control::ERROR_CODE_UNSPECIFIED || !control::ErrorCode_IsValid(e.code()))
    return InvalidArgument("code " + SNum(e.code()) + " is unspecified or unknown");
  if (e.message().empty()) return InvalidArgument("message is empty");
  if (e.lost_peer_world_ranks_size() > kMaxLostPeers)
    return InvalidArgument("lost_peer_world_ranks has " + SNum(e.lost_peer_world_ranks_size()) +
                           " entries, more than " + SNum(kMaxLostPeers));
  return Status::Ok();
}

Status CheckLogprob(float logprob, const std::string& at) {
  if (std::isnan(logprob) || logprob > 0.0f)
    return InvalidArgument(at + ": logprob " + std::to_string(logprob) + " is NaN or > 0");
  return Status::Ok();
}

Status ValidateStepResult(const control::StepResult& r) {
  if (r.plan_version() == 0) return InvalidArgument("plan_version is 0");
  if (r.has_error()) {
    if (r.tokens_size() > 0)
      return InvalidArgument("error is set together with " + SNum(r.tokens_size()) + " tokens");
    TESSERA_RETURN_IF_ERROR_CTX(ValidateError(r.error()), "error");
    return Status::Ok();
  }
  for (int i = 0; i < r.tokens_size(); ++i) {
    const control::SampledToken& t = r.tokens(i);
    const std::string at =
        Idx("tokens", static_cast<size_t>(i)) + " (seq_id " + SNum(t.seq_id()) + ")";
    // kNonFiniteLogitsToken: the sampling rank found NaN/inf logits for this
    // sequence (no token, no log-probabilities; the scheduler fails it).
    if (IsFailedToken(t.token_id())) {
      if (t.has_logprobs() || t.top_logprobs_size() > 0)
        return InvalidArgument(at + ": non-finite-logits token with log-probabilities");
      continue;
    }
    if (t.token_id() < 0) return InvalidArgument(at + ": token_id " + SNum(t.token_id()) + " < 0");
    TESSERA_RETURN_IF_ERROR(CheckLogprob(t.logprob(), at));
    if (!t.has_logprobs() && (t.logprob() != 0.0f || t.top_logprobs_size() > 0))
      return InvalidArgument(at + ": logprob or top_logprobs set without has_logprobs");
    if (t.top_logprobs_size() > kMaxTopLogprobs)
      return InvalidArgument(at + ": " + SNum(t.top_logprobs_size()) + " top_logprobs exceed " +
                             SNum(kMaxTopLogprobs));
    for (int j = 0; j < t.top_logprobs_size(); ++j) {
      const std::string tat = at + ".top_logprobs[" + SNum(j) + "]";
      if (t.top_logprobs(j).token_id() < 0)
        return InvalidArgument(tat + ": token_id " + SNum(t.top_logprobs(j).token_id()) + " < 0");
      TESSERA_RETURN_IF_ERROR(CheckLogprob(t.top_logprobs(j).logprob(), tat));
    }
    for (int j = 0; j < t.prompt_logprobs_size(); ++j) {
      const control::PromptTokenLogprob& p = t.prompt_logprobs(j);
      const std::string pat = at + ".prompt_logprobs[" + SNum(j) + "]";
      if (p.token_id() < 0)
        return InvalidArgument(pat + ": token_id " + SNum(p.token_id()) + " < 0");
      TESSERA_RETURN_IF_ERROR(CheckLogprob(p.logprob(), pat));
      if (p.top_logprobs_size() > kMaxTopLogprobs)
        return InvalidArgument(pat + ": " + SNum(p.top_logprobs_size()) + " top_logprobs exceed " +
                               SNum(kMaxTopLogprobs));
      for (const control::TokenLogprob& top : p.top_logprobs()) {
        if (top.token_id() < 0) return InvalidArgument(pat + ": a top token_id < 0");
        TESSERA_RETURN_IF_ERROR(CheckLogprob(top.logprob(), pat + ".top_logprobs"));
      }
    }
  }
  return Status::Ok();
}

Status ValidateBody(const Envelope& e) {
  switch (e.body_case()) {
    case Envelope::kRegisterWorker:
      return ValidateRegister(e.register_worker());
    case Envelope::kRegisterAck:
      return ValidateRegisterAck(e.register_ack(), e.worker_id());
    case Envelope::kHeartbeat:
      return ValidateHeartbeat(e.heartbeat());
    case Envelope::kAssignShard:
      return ValidateAssignShard(e.assign_shard());
    case Envelope::kLoadProgress: {
      const control::LoadProgress& p = e.load_progress();
      if (p.plan_version() == 0) return InvalidArgument("plan_version is 0");
      if (p.bytes_done() > p.bytes_total())
        return InvalidArgument("bytes_done " + Num(p.bytes_done()) + " exceeds bytes_total " +
                               Num(p.bytes_total()));
      return CheckSeconds(p.seconds(), "seconds");
    }
    case Envelope::kLoaded: {
      const control::Loaded& l = e.loaded();
      if (l.plan_version() == 0) return InvalidArgument("plan_version is 0");
      return CheckSeconds(l.load_seconds(), "load_seconds");
    }
    case Envelope::kStep:
      return ValidateStep(e.step());
    case Envelope::kStepResult:
      return ValidateStepResult(e.step_result());
    case Envelope::kDrain:
    case Envelope::kShutdown:
      return Status::Ok();
    case Envelope::kError:
      return ValidateError(e.error());
    case Envelope::kGenerate:
      return ValidateGenerate(e.generate());
    case Envelope::kCancelRequests:
      return ValidateCancelRequests(e.cancel_requests());
    case Envelope::kRequestUpdates:
      return ValidateRequestUpdates(e.request_updates());
    case Envelope::BODY_NOT_SET:
      break;
  }
  return InvalidArgument("envelope has no body");
}

}  // namespace

SamplingParams SamplingParamsFromProto(const control::SamplingParams& message) {
  return SamplingFromProto(message);
}
void SamplingParamsToProto(const SamplingParams& params, control::SamplingParams* out) {
  SamplingToProto(params, out);
}

namespace wire_internal {
Status ValidateSampling(const control::SamplingParams& s) { return ::tessera::ValidateSampling(s); }
Status ValidateError(const control::Error& e) { return ::tessera::ValidateError(e); }
Status CheckLogprob(float logprob, const std::string& at) {
  return ::tessera::CheckLogprob(logprob, at);
}
}  // namespace wire_internal

const char* EnvelopeBodyName(const Envelope& e) {
  switch (e.body_case()) {
    case Envelope::kRegisterWorker:
      return "register_worker";
    case Envelope::kRegisterAck:
      return "register_ack";
    case Envelope::kHeartbeat:
      return "heartbeat";
    case Envelope::kAssignShard:
      return "assign_shard";
    case Envelope::kLoadProgress:
      return "load_progress";
    case Envelope::kLoaded:
      return "loaded";
    case Envelope::kStep:
      return "step";
    case Envelope::kStepResult:
      return "step_result";
    case Envelope::kDrain:
      return "drain";
    case Envelope::kShutdown:
      return "shutdown";
    case Envelope::kError:
      return "error";
    case Envelope::kGenerate:
      return "generate";
    case Envelope::kCancelRequests:
      return "cancel_requests";
    case Envelope::kRequestUpdates:
      return "request_updates";
    case Envelope::BODY_NOT_SET:
      break;
  }
  return "none";
}

bool IsValidWorkerId(std::string_view id) {
  if (id.empty() || id.size() > kMaxWorkerIdBytes) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '@' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Status ValidateEnvelope(const Envelope& e) {
  if (e.protocol_version() != kControlProtocolVersion)
    return Unimplemented("protocol_version " + Num(e.protocol_version()) +
                         " is not supported (this build speaks " + Num(kControlProtocolVersion) +
                         ")");
  if (e.body_case() == Envelope::BODY_NOT_SET) return InvalidArgument("envelope has no body");
  const char* body = EnvelopeBodyName(e);
  const bool id_optional =
      e.body_case() == Envelope::kRegisterWorker ||
      (e.body_case() == Envelope::kRegisterAck && !e.register_ack().accepted());
  if (e.worker_id().empty()) {
    if (!id_optional) return InvalidArgument(std::string(body) + ": worker_id is empty");
  } else if (!IsValidWorkerId(e.worker_id())) {
    return InvalidArgument(std::string(body) + ": worker_id is not 1.." + Num(kMaxWorkerIdBytes) +
                           " bytes of [A-Za-z0-9._:@-]");
  }
  TESSERA_RETURN_IF_ERROR_CTX(ValidateBody(e), body);
  return Status::Ok();
}

StatusOr<std::string> EncodeEnvelope(const Envelope& envelope, size_t max_bytes) {
  TESSERA_RETURN_IF_ERROR(ValidateEnvelope(envelope));
  const size_t size = envelope.ByteSizeLong();
  if (size > max_bytes || size > static_cast<size_t>(INT_MAX))
    return OutOfRange(std::string(EnvelopeBodyName(envelope)) + ": message of " + Num(size) +
                      " bytes exceeds the limit of " + Num(max_bytes) + " bytes");
  std::string out;
  if (!envelope.SerializeToString(&out))
    return Internal(std::string(EnvelopeBodyName(envelope)) + ": protobuf serialization failed");
  return out;
}

Status DecodeEnvelopeInto(std::string_view bytes, size_t max_bytes, Envelope* out) {
  if (bytes.size() > max_bytes || bytes.size() > static_cast<size_t>(INT_MAX))
    return OutOfRange("message of " + Num(bytes.size()) + " bytes exceeds the limit of " +
                      Num(max_bytes) + " bytes");
  if (!out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return InvalidArgument("message of " + Num(bytes.size()) +
                           " bytes is not a valid protobuf Envelope");
  return ValidateEnvelope(*out);
}

StatusOr<Envelope> DecodeEnvelope(std::string_view bytes, size_t max_bytes) {
  Envelope envelope;
  TESSERA_RETURN_IF_ERROR(DecodeEnvelopeInto(bytes, max_bytes, &envelope));
  return envelope;
}

void StepBatchToProto(const StepBatch& batch, control::StepBatch* out) {
  out->Clear();
  out->mutable_token_ids()->Add(batch.token_ids.begin(), batch.token_ids.end());
  for (const SeqStep& s : batch.seqs) {
    control::SeqStep* m = out->add_seqs();
    m->set_seq_id(s.seq_id);
    m->set_start_pos(s.start_pos);
    m->set_num_tokens(s.num_tokens);
    m->set_prompt_len(s.prompt_len);
    m->mutable_block_table()->Add(s.block_table.begin(), s.block_table.end());
    m->set_want_logits(s.want_logits);
    SamplingToProto(s.sampling, m->mutable_sampling());
    m->set_output_start(s.output_start);
    m->mutable_history()->Add(s.history.begin(), s.history.end());
    m->set_want_prompt_logprobs(s.want_prompt_logprobs);
  }
  out->mutable_finished_seq_ids()->Add(batch.finished_seq_ids.begin(),
                                       batch.finished_seq_ids.end());
}

StatusOr<StepBatch> StepBatchFromProto(const control::StepBatch& message) {
  TESSERA_RETURN_IF_ERROR(ValidateStepBatch(message));
  StepBatch batch;
  batch.token_ids.assign(message.token_ids().begin(), message.token_ids().end());
  batch.seqs.reserve(static_cast<size_t>(message.seqs_size()));
  for (const control::SeqStep& m : message.seqs()) {
    SeqStep s;
    s.seq_id = m.seq_id();
    s.start_pos = m.start_pos();
    s.num_tokens = m.num_tokens();
    s.prompt_len = m.prompt_len();
    s.block_table.assign(m.block_table().begin(), m.block_table().end());
    s.want_logits = m.want_logits();
    s.sampling = SamplingFromProto(m.sampling());
    s.output_start = m.output_start();
    s.history.assign(m.history().begin(), m.history().end());
    s.want_prompt_logprobs = m.want_prompt_logprobs();
    batch.seqs.push_back(std::move(s));
  }
  batch.finished_seq_ids.assign(message.finished_seq_ids().begin(),
                                message.finished_seq_ids().end());
  return batch;
}

void SampledTokensToProto(const StepBatch& batch, const std::vector<SampledToken>& tokens,
                          control::StepResult* out) {
  size_t k = 0;
  for (const SeqStep& s : batch.seqs) {
    if (!s.want_logits) continue;
    const SampledToken& sampled = tokens[k++];
    control::SampledToken* t = out->add_tokens();
    t->set_seq_id(s.seq_id);
    t->set_token_id(sampled.token_id);
    for (const SampledToken& p : sampled.prompt_logprobs) {
      control::PromptTokenLogprob* m = t->add_prompt_logprobs();
      m->set_token_id(p.token_id);
      m->set_logprob(p.logprob);
      for (const TopLogprob& top : p.top) {
        control::TokenLogprob* e = m->add_top_logprobs();
        e->set_token_id(top.token_id);
        e->set_logprob(top.logprob);
      }
    }
    if (!sampled.has_logprobs) continue;
    t->set_has_logprobs(true);
    t->set_logprob(sampled.logprob);
    for (const TopLogprob& top : sampled.top) {
      control::TokenLogprob* e = t->add_top_logprobs();
      e->set_token_id(top.token_id);
      e->set_logprob(top.logprob);
    }
  }
}

StatusOr<std::vector<SampledToken>> SampledTokensFromProto(const control::StepResult& result,
                                                           size_t wanted, int64_t vocab_size) {
  if (static_cast<size_t>(result.tokens_size()) != wanted)
    return InvalidArgument("step_result has " + SNum(result.tokens_size()) + " tokens for " +
                           Num(wanted) + " sampled sequences");
  auto outside = [&](int32_t id) { return id < 0 || id >= vocab_size; };
  std::vector<SampledToken> tokens(wanted);
  for (size_t i = 0; i < wanted; ++i) {
    const control::SampledToken& t = result.tokens(static_cast<int>(i));
    const std::string at = Idx("tokens", i) + " (seq_id " + SNum(t.seq_id()) + ")";
    SampledToken& out = tokens[i];
    out.token_id = t.token_id();
    if (IsFailedToken(t.token_id())) continue;  // no token, no log-probabilities
    if (outside(t.token_id()))
      return InvalidArgument(at + ": token_id " + SNum(t.token_id()) + " is outside the vocab of " +
                             SNum(vocab_size));
    for (const control::PromptTokenLogprob& p : t.prompt_logprobs()) {
      SampledToken e;
      e.token_id = p.token_id();
      e.has_logprobs = true;
      e.logprob = p.logprob();
      bool bad = outside(e.token_id);
      for (const control::TokenLogprob& top : p.top_logprobs()) {
        bad = bad || outside(top.token_id());
        e.top.push_back({top.token_id(), top.logprob()});
      }
      if (bad)
        return InvalidArgument(at + ": a prompt log-probability is outside the vocab of " +
                               SNum(vocab_size));
      out.prompt_logprobs.push_back(std::move(e));
    }
    if (!t.has_logprobs()) continue;
    out.has_logprobs = true;
    out.logprob = t.logprob();
    for (const control::TokenLogprob& top : t.top_logprobs()) {
      if (outside(top.token_id()))
        return InvalidArgument(at + ": top token " + SNum(top.token_id()) +
                               " is outside the vocab of " + SNum(vocab_size));
      out.top.push_back({top.token_id(), top.logprob()});
    }
  }
  return tokens;
}

control::Error StatusToError(const Status& status, uint64_t in_reply_to_seq) {
  control::Error e;
  e.set_in_reply_to_seq(in_reply_to_seq);
  if (status.ok()) {
    e.set_code(control::ERROR_CODE_INTERNAL);
    e.set_message("OK");
    return e;
  }
  // StatusCode values 1..11 and ErrorCode values 1..11 name the same codes.
  e.set_code(static_cast<control::ErrorCode>(static_cast<int>(status.code())));
  e.set_message(status.message());
  return e;
}

Status ErrorToStatus(const control::Error& error) {
  if (error.code() == control::ERROR_CODE_UNSPECIFIED || !control::ErrorCode_IsValid(error.code()))
    return Internal("unknown error code " + SNum(error.code()) + ": " + error.message());
  return Status(static_cast<StatusCode>(static_cast<int>(error.code())), error.message());
}

}  // namespace tessera
