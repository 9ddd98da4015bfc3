// StepBatch: the unit of work one forward step (one micro-batch) runs.
//
// Tokens of all sequences are concatenated with no padding. Each sequence
// contributes either a prefill chunk (num_tokens >= 1 starting at start_pos)
// or one decode token; its block table maps positions to KV-cache blocks
// (see kernels/paged_attention.h). The scheduler builds StepBatches; every
// stage of the pipeline receives the same metadata.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/sampling_params.h"

namespace tessera {

struct SeqStep {
  int64_t seq_id = 0;
  int32_t start_pos = 0;   // tokens of this sequence already in the KV cache
  int32_t num_tokens = 0;  // tokens of this sequence in this step
  // Length of the sequence's prompt. Dynamic-NTK RoPE scales by the length
  // of the whole prompt while prefilling, as HF does when it prefills in one
  // pass, so a chunked prefill rotates keys exactly like an unchunked one.
  int32_t prompt_len = 0;
  std::vector<int32_t> block_table;  // KV blocks covering [0, start_pos + num_tokens)
  bool want_logits = false;          // sample from the last token of this chunk
  // Also return the log-probabilities of this chunk's tokens after its first
  // (SampledToken::prompt_logprobs; the chunk is the whole prompt, and
  // want_logits is set): the last stage computes logits for every position.
  bool want_prompt_logprobs = false;
  SamplingParams sampling;  // used where want_logits; the seed starts the sequence's RNG
  // Token history for logits processing (only where sampling.NeedsHistory()):
  // the sampling rank keeps each such sequence's tokens by position from the
  // batches it sees. Positions >= output_start were generated (the original
  // prompt's length; penalties count them as output).
  int32_t output_start = 0;
  // Tokens [0, start_pos) the sampling rank has not seen (a prefix-cache
  // hit): sent on the sequence's first step after each admission when
  // start_pos > 0, else empty. Empty or exactly start_pos tokens.
  std::vector<int32_t> history;
};

struct StepBatch {
  std::vector<int32_t> token_ids;  // [total_tokens], concatenated per sequence
  std::vector<SeqStep> seqs;
  // Sequences that finished since the previous batch: ranks that keep
  // per-sequence state (the sampling rank's RNG) drop it.
  std::vector<int64_t> finished_seq_ids;

  int64_t total_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  // Rows of logits the last stage computes: one per want_logits sequence
  // (the rows sampled, in batch order), then num_tokens - 1 per
  // want_prompt_logprobs sequence (its positions start_pos .. start_pos +
  // num_tokens - 2, in batch order).
  int64_t SampledRows() const {
    int64_t n = 0;
    for (const SeqStep& s : seqs) n += s.want_logits ? 1 : 0;
    return n;
  }
  int64_t LogitsRows() const {
    int64_t n = SampledRows();
    for (const SeqStep& s : seqs)
      if (s.want_prompt_logprobs && s.num_tokens > 1) n += s.num_tokens - 1;
    return n;
  }
  // Absolute positions of every token, [total_tokens].
  std::vector<int32_t> Positions() const {
    std::vector<int32_t> pos;
    pos.reserve(token_ids.size());
    for (const SeqStep& s : seqs)
      for (int32_t i = 0; i < s.num_tokens; ++i) pos.push_back(s.start_pos + i);
    return pos;
  }
};

}  // namespace tessera
