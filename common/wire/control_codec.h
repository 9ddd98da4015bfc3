// Control codec: turns control-plane Envelopes (common/wire/control.proto)
// into bytes and back, and is the one place their contents are validated.
//
// A receiver calls DecodeEnvelope on every ZeroMQ frame; whatever it returns
// OK is well formed: a supported protocol_version, exactly one body, a
// worker_id of the allowed shape where one is required, and body fields in
// range (the rules are listed at ValidateEnvelope). A sender calls
// EncodeEnvelope, which applies the same rules, so a bad message is caught on
// the side that made it. Nothing here throws; protobuf's parser reports
// failure by return value and is called only on inputs within the size limit.
//
// Thread-safety: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/sampled_token.h"
#include "common/base/sampling_params.h"
#include "common/base/status.h"
#include "common/wire/control.pb.h"
#include "common/wire/step_batch.h"

namespace tessera {

// The protocol version this build speaks (Envelope.protocol_version). A
// decoder accepts exactly this version.
inline constexpr uint32_t kControlProtocolVersion = 1;

// Default bound of one serialized Envelope, bytes. A Step of a large batch
// is the biggest message (token ids + block tables), far below this.
inline constexpr size_t kDefaultMaxControlMessageBytes = size_t{64} << 20;

// RegisterAck.reason prefix of the refusal the coordinator sends a peer it
// does not know (the coordinator restarted, or the worker was declared lost
// while it kept running): the worker registers again (ControlClient does so
// by itself) instead of treating it as a final refusal.
inline constexpr char kRegisterAgainPrefix[] = "register again: ";

// Longest accepted worker id, bytes. Ids use [A-Za-z0-9._:@-] only, so they
// print safely in logs and URLs.
inline constexpr size_t kMaxWorkerIdBytes = 128;
// Most Error.lost_peer_world_ranks entries (a rank talks to its tp group,
// its pipeline neighbours and the stage-0 ranks it returns tokens to).
inline constexpr int kMaxLostPeers = 1024;

// Size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES in nccl.h), bytes.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// The name of the body field that is set ("register_worker", "heartbeat",
// "step", ...), or "none".
const char* EnvelopeBodyName(const control::Envelope& envelope);

// Whether `id` is a valid worker id: 1..kMaxWorkerIdBytes bytes of
// [A-Za-z0-9._:@-].
bool IsValidWorkerId(std::string_view id);

// Checks an Envelope. Errors name the body and field at fault:
//  - kUnimplemented: protocol_version is not kControlProtocolVersion;
//  - kInvalidArgument:
//    - no body is set;
//    - worker_id is malformed (see IsValidWorkerId), or empty where it is
//      required (every body but register_worker and a rejecting register_ack);
//    - register_worker: empty host; no devices; a repeated Device.index; a
//      device with free > total memory or an unspecified/unknown kind; a
//      topology entry naming a device index not in devices or an unknown
//      LinkPath;
//    - register_ack: accepted without worker_id equal to Envelope.worker_id
//      or with heartbeat_interval_ms 0; rejected without a reason;
//    - heartbeat: unspecified/unknown state; a DeviceMemory with used >
//      total (total > 0);
//    - assign_shard: plan_version 0; tp or pp 0; layers_per_stage not pp
//      entries or an entry 0; stage >= pp; tp_rank >= tp; world_rank !=
//      stage * tp + tp_rank; [first_layer, end_layer) not the stage's layers
//      per layers_per_stage; empty model_path; dtype not F32/F16/BF16;
//      kv_block_size 0; kv_num_blocks 0; no rendezvous; gloo with empty
//      store_host or key_prefix, a port outside 1..65535 or a store_key
//      not 32 bytes; nccl ids not
//      kNcclUniqueIdBytes long; tokens_to_leader on a rank not of the last
//      stage, or at pp 1;
//    - load_progress: plan_version 0; bytes_done > bytes_total; seconds
//      negative or not finite;
//    - loaded: plan_version 0; load_seconds negative or not finite;
//    - step: plan_version 0; no batch sequences; a token id < 0; per
//      sequence: num_tokens < 1, start_pos < 0, a repeated seq_id, an empty
//      block table or a block id < 0, sampling out of range (temperature,
//      top_k, top_p as SamplingParams::Validate; num_top_logprobs >
//      kMaxTopLogprobs, or > 0 without logprobs); the sum of num_tokens !=
//      token_ids size;
//    - step_result: plan_version 0; an error together with tokens; an error
//      that fails the error rules; a token id < 0; a logprob that is NaN or
//      > 0; more than kMaxTopLogprobs top logprobs; a non-zero logprob or
//      top logprobs without has_logprobs;
//    - error: unspecified/unknown code; empty message;
//    - generate, cancel_requests, request_updates: common/wire/leader_messages.h.
Status ValidateEnvelope(const control::Envelope& envelope);

// Validates `envelope` and serializes it.
// Errors: those of ValidateEnvelope; kOutOfRange when the serialized size
// exceeds `max_bytes` (the message names both sizes).
StatusOr<std::string> EncodeEnvelope(const control::Envelope& envelope,
                                     size_t max_bytes = kDefaultMaxControlMessageBytes);

// Parses and validates one serialized Envelope.
// Errors: kOutOfRange when bytes.size() > max_bytes (checked before parsing);
// kInvalidArgument when the bytes are not a protobuf Envelope; then those
// of ValidateEnvelope (empty input parses as protocol_version 0:
// kUnimplemented).
StatusOr<control::Envelope> DecodeEnvelope(std::string_view bytes,
                                           size_t max_bytes = kDefaultMaxControlMessageBytes);
// DecodeEnvelope into `*out`, an empty message that may live on a protobuf
// Arena: a receiver of many frames decodes each onto one arena, so a
// message's repeated fields and strings cost no heap allocation each.
// Errors: DecodeEnvelope's; `*out` is then unspecified.
Status DecodeEnvelopeInto(std::string_view bytes, size_t max_bytes, control::Envelope* out);

// StepBatch <-> control::StepBatch. SamplingParams::logprobs -1 maps to
// logprobs false and num_top_logprobs 0; n >= 0 to logprobs true and
// num_top_logprobs n.
void StepBatchToProto(const StepBatch& batch, control::StepBatch* out);
// Errors: kInvalidArgument as the step rules of ValidateEnvelope, naming
// "batch.seqs[i]" or "batch.token_ids[i]".
StatusOr<StepBatch> StepBatchFromProto(const control::StepBatch& message);

// SamplingParams <-> control::SamplingParams, as StepBatchToProto maps
// them (stop_token_ids are not part of the message). FromProto does not
// validate: ValidateEnvelope has.
SamplingParams SamplingParamsFromProto(const control::SamplingParams& message);
void SamplingParamsToProto(const SamplingParams& params, control::SamplingParams* out);

// The sampled tokens of one micro-batch -> `out`'s tokens (plan_version and
// micro_batch_id are the caller's): one entry per want_logits sequence of
// `batch`, in batch order, with its seq_id, log-probabilities and prompt
// log-probabilities. `tokens` has one entry per want_logits sequence.
void SampledTokensToProto(const StepBatch& batch, const std::vector<SampledToken>& tokens,
                          control::StepResult* out);
// The reverse, for a StepResult that ValidateEnvelope accepted: `wanted`
// tokens (the micro-batch's want_logits count), each id (the non-finite-logits
// token aside) and every log-probability's token below `vocab_size`.
// Errors: kInvalidArgument naming the count or the token at fault.
StatusOr<std::vector<SampledToken>> SampledTokensFromProto(const control::StepResult& result,
                                                           size_t wanted, int64_t vocab_size);

// Status <-> control::Error (codes map one to one; an OK status has no
// Error and maps to ERROR_CODE_INTERNAL with message "OK").
control::Error StatusToError(const Status& status, uint64_t in_reply_to_seq = 0);
Status ErrorToStatus(const control::Error& error);

}  // namespace tessera
