// One entry of logits processing (kernels/logit_adjust.h): the changes to
// one logit of one row, and the formula that applies them, shared by the
// CPU loop and the CUDA kernel (C++17, host and device).
//
// For the logit l of `token` in row `row`, in this order (vLLM's sampler:
// logit_bias, then the penalties; min_tokens' ban last so that a banned
// logit stays the lowest finite float instead of overflowing):
//   1. l += bias                                   (OpenAI logit_bias)
//   2. if repetition != 1 and the token occurs in the prompt or the output:
//        l = l > 0 ? l / repetition : l * repetition
//                                                  (HF RepetitionPenaltyLogitsProcessor,
//                                                   Keskar et al. 2019; vLLM applies it
//                                                   to prompt and output tokens alike)
//   3. l -= frequency * output_count + presence * (output_count > 0 ? 1 : 0)
//                                                  (OpenAI's presence/frequency penalties,
//                                                   over the generated tokens)
//   4. if banned: l = kBannedLogit                 (min_tokens: EOS and stop_token_ids)
// Thread-safety: pure values and functions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif

namespace tessera::kernels {

// The lowest finite float: a banned token's probability is exactly 0 at any
// temperature, and the row stays finite (kernels/sampling.h reads a
// non-finite logit as the model's overflow).
inline constexpr float kBannedLogit = -3.402823466e+38f;

inline constexpr uint32_t kLogitInPrompt = 1;  // the token occurs in the prompt
inline constexpr uint32_t kLogitBanned = 2;    // min_tokens: never drawn

struct LogitAdjustment {
  int64_t row = 0;           // logits row
  int32_t token = 0;         // in [0, vocab)
  int32_t output_count = 0;  // times the token was generated so far
  float bias = 0.0f;
  float presence = 0.0f;    // the row's presence_penalty
  float frequency = 0.0f;   // the row's frequency_penalty
  float repetition = 1.0f;  // the row's repetition_penalty (> 0)
  uint32_t flags = 0;       // kLogitInPrompt | kLogitBanned
};

// Round-to-nearest float operations that the device compiler does not fuse
// into an FMA, so both backends compute the same bits.
#if defined(__CUDA_ARCH__)
#define TESSERA_FADD(a, b) __fadd_rn(a, b)
#define TESSERA_FMUL(a, b) __fmul_rn(a, b)
#define TESSERA_FDIV(a, b) __fdiv_rn(a, b)
#else
#define TESSERA_FADD(a, b) ((a) + (b))
#define TESSERA_FMUL(a, b) ((a) * (b))
#define TESSERA_FDIV(a, b) ((a) / (b))
#endif

TESSERA_HOST_DEVICE inline float AdjustedLogit(float l, const LogitAdjustment& a) {
  l = TESSERA_FADD(l, a.bias);
  if (a.repetition != 1.0f && ((a.flags & kLogitInPrompt) != 0 || a.output_count > 0))
    l = l > 0.0f ? TESSERA_FDIV(l, a.repetition) : TESSERA_FMUL(l, a.repetition);
  const float penalty = TESSERA_FADD(TESSERA_FMUL(a.frequency, static_cast<float>(a.output_count)),
                                     a.output_count > 0 ? a.presence : 0.0f);
  l = TESSERA_FADD(l, -penalty);
  if ((a.flags & kLogitBanned) != 0) l = kBannedLogit;
  return l;
}

#undef TESSERA_FADD
#undef TESSERA_FMUL
#undef TESSERA_FDIV

}  // namespace tessera::kernels
