// The Scheduler's KV-block side (common/engine/scheduler.h): block
// allocation and preemption, longrope recomputation, prefix caching and the
// prompt blocks the choices of one prompt share.
#include <algorithm>
#include <mutex>
#include <span>

#include "common/engine/scheduler.h"
#include "common/engine/scheduler_seq.h"

namespace tessera {

Scheduler::SharedPrompt Scheduler::SharedPromptBlocks(const Seq& s) const {
  SharedPrompt out;
  // Only at a choice's first admission, with the whole prompt to compute.
  if (s.prompt_source < 0 || s.generated > 0 || s.prompt_logprobs_pending || !SharesBlocks(s))
    return out;
  const Seq* src = nullptr;
  for (const auto& r : running_)
    if (r->id == s.prompt_source) src = r.get();
  if (!src || src->done || !SharesBlocks(*src)) return out;  // gone or preempted: prefill
  // The blocks before the one holding the last prompt token (that token
  // must be computed: its logits are sampled), as for a prefix-cache hit.
  const int64_t share = (static_cast<int64_t>(s.prompt_len) - 1) / block_size_;
  if (share == 0) return out;
  if (src->cached < share * block_size_ || static_cast<int64_t>(src->blocks.size()) < share) {
    out.wait = src->cached < share * block_size_;
    return out;
  }
  out.blocks.assign(src->blocks.begin(), src->blocks.begin() + share);
  return out;
}

// Longrope (Phi-3, RopeType::kLongRope): transformers rotates q and k with the
// short factors while a sequence is at most original_max_position_embeddings
// long and with the long ones past it, and when a sequence first outgrows it,
// Phi3ForCausalLM.prepare_inputs_for_generation drops the KV cache so that
// generate() recomputes the whole sequence with the long factors (every
// layer's keys and values change, not only the rotation). The same here: the
// sequence's cache is marked empty (its blocks are kept and overwritten) and
// prompt + generated are prefilled again, all with the long factors (the
// workers pick them from SeqStep::prompt_len = the recomputed length). A
// sequence whose prompt already exceeds the pre-training context was
// computed with the long factors from the start. Any sequence recomputed
// from an empty cache (a preempted one too) scales by its whole length.
void Scheduler::LongRopeRecompute(Seq& s) {
  if (config_.rope_scaling.type != RopeType::kLongRope) return;
  const int64_t original = config_.rope_scaling.original_max_position_embeddings;
  const int64_t total = static_cast<int64_t>(s.tokens.size());
  if (s.cached > 0 && s.cached <= original && total > original && s.rope_len <= original) {
    s.cached = 0;
    ++stats_.longrope_recomputes;
  }
  if (s.cached == 0) s.rope_len = static_cast<int32_t>(total);
}

void Scheduler::Preempt(Seq& s) {
  allocator_->Free(s.blocks);
  s.cached = 0;
  s.registered_blocks = 0;
  s.waiting = true;
  ++s.preemptions;
  ++stats_.preemptions;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == &s) {
      waiting_.push_front(std::move(*it));
      running_.erase(it);
      break;
    }
  }
  running_count_.store(running_.size());
}

bool Scheduler::EnsureBlocks(Seq& s, int64_t tokens, StepPlan& plan) {
  while (true) {
    const int64_t need =
        BlockAllocator::BlocksFor(tokens, block_size_) - static_cast<int64_t>(s.blocks.size());
    if (need <= 0) return true;
    if (allocator_->Allocate(need, s.blocks).ok()) return true;
    // Preempt the newest running sequence that is not in flight (not s).
    Seq* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      Seq* c = it->get();
      if (c != &s && !c->in_flight && !c->done) {
        victim = c;
        break;
      }
    }
    if (!victim) return false;
    plan.preempted.push_back(victim->id);
    Preempt(*victim);
  }
}
void Scheduler::ClearPrefixCache() {
  allocator_->ClearCache();
  // Blocks of running sequences lost their keys; they are not registered
  // again (their KV may predate the clear).
}

bool Scheduler::Cacheable(const Seq& s) const { return options_.prefix_caching && SharesBlocks(s); }

bool Scheduler::SharesBlocks(const Seq& s) const {
  if (config_.rope_scaling.type == RopeType::kDynamic &&
      static_cast<int64_t>(s.prompt_len) + s.req.max_tokens > config_.max_position_embeddings)
    return false;
  // Longrope: a block's KV depends on the factor set (short up to
  // original_max_position_embeddings, long past it: LongRopeRecompute), so
  // only sequences that stay short from start to end share blocks.
  if (config_.rope_scaling.type == RopeType::kLongRope &&
      static_cast<int64_t>(s.prompt_len) + s.req.max_tokens >
          config_.rope_scaling.original_max_position_embeddings)
    return false;
  return true;
}

void Scheduler::ComputeKeys(Seq& s, int64_t blocks) {
  if (s.keys_version != plan_version_) {
    s.keys.clear();
    s.keys_version = plan_version_;
  }
  for (int64_t i = static_cast<int64_t>(s.keys.size()); i < blocks; ++i) {
    const std::span<const int32_t> tokens(s.tokens.data() + i * block_size_,
                                          static_cast<size_t>(block_size_));
    s.keys.push_back(
        ChainBlockKey(i == 0 ? nullptr : &s.keys.back(), options_.model_id, plan_version_, tokens));
  }
}

void Scheduler::RegisterFullBlocks(Seq& s) {
  if (s.done || !Cacheable(s)) return;
  const int64_t full = s.cached / block_size_;
  if (full <= s.registered_blocks) return;
  ComputeKeys(s, full);
  for (int64_t i = s.registered_blocks; i < full; ++i)
    allocator_->Register(s.blocks[static_cast<size_t>(i)], s.keys[static_cast<size_t>(i)]);
  s.registered_blocks = static_cast<int32_t>(full);
}

}  // namespace tessera
