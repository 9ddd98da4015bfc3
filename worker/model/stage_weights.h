// The weights one rank holds for its pipeline stage, already sliced for its
// tp rank and converted to the compute dtype (F32 on the CPU backend).
//
// Shapes use local sizes: heads_local = num_attention_heads / tp,
// kv_heads_local = max(1, num_key_value_heads / tp), inter_local =
// intermediate_size / tp, vocab_local = padded_vocab / tp.
//
// Fused projections: each layer holds its q, k and v rows as ONE tensor
// qkv_proj [(heads_local + 2 * kv_heads_local) * head_dim, hidden] (this
// rank's q rows, then its k rows, then its v rows) and its gate and up rows
// as ONE tensor gate_up_proj [2 * inter_local, hidden] (gate, then up), so
// the forward pass runs one GEMM for each. Their biases, when the family has
// them, are fused the same way (qkv_bias, gate_up_bias). q_proj, k_proj,
// v_proj, gate_proj, up_proj and the part biases are Slice0 row views of the
// fused tensors (they share the storage: nothing is held twice); the loader
// fills every part in place, from its own rows of the checkpoint.
//
// Thread-safety: immutable after loading; shared by the owner thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/tensor.h"
#include "kernels/linear_fp8.h"

namespace tessera {

// One routed expert a rank holds (a sparse layer of an MoE model): its
// gate/up/down projections, whole under expert parallelism, else this tp
// rank's column/row slice (moe_inter_local = moe_intermediate_size / tp).
struct ExpertWeights {
  int expert = -1;   // the global expert id (the router's row)
  Tensor gate_proj;  // [moe_inter_local, hidden]
  Tensor up_proj;    // [moe_inter_local, hidden]
  Tensor down_proj;  // [hidden, moe_inter_local]
};

struct LayerWeights {
  Tensor input_norm;  // [hidden]                                replicated
  Tensor qkv_proj;    // [(heads_local + 2*kv_heads_local) * head_dim, hidden]: q|k|v rows
  Tensor qkv_bias;    // [(heads_local + 2*kv_heads_local) * head_dim], or undefined
  // Views of qkv_proj / qkv_bias:
  Tensor q_proj, q_bias;  // [heads_local * head_dim, hidden], [..]  column-parallel
  Tensor k_proj, k_bias;  // [kv_heads_local * head_dim, hidden]     column-parallel
  Tensor v_proj, v_bias;  // [kv_heads_local * head_dim, hidden]     column-parallel
  Tensor q_norm, k_norm;  // [head_dim] per-head RMSNorm (Qwen3, Gemma 3) replicated, or undefined
  Tensor o_proj;          // [hidden, heads_local * head_dim]        row-parallel
  Tensor o_bias;          // [hidden] added once after the all-reduce, or undefined
  // [hidden] replicated: before the MLP, or (with pre_ff_norm: Gemma) on the
  // attention output before its residual add.
  Tensor post_norm;
  Tensor pre_ff_norm;   // [hidden] before the MLP (Gemma)         replicated, or undefined
  Tensor gate_up_proj;  // [2 * inter_local, hidden]: gate rows, then up rows
  Tensor gate_up_bias;  // [2 * inter_local] or undefined (mlp_bias)
  // Views of gate_up_proj / gate_up_bias:
  Tensor gate_proj;           // [inter_local, hidden]                   column-parallel
  Tensor up_proj;             // [inter_local, hidden]                   column-parallel
  Tensor gate_bias, up_bias;  // [inter_local] or undefined (mlp_bias)
  Tensor down_proj;           // [hidden, inter_local]                   row-parallel
  Tensor down_bias;           // [hidden] added once after the all-reduce, or undefined
  Tensor post_ff_norm;        // [hidden] on the MLP output (Gemma)      replicated, or undefined
  // A sparse layer of an MoE model (the dense MLP tensors above are then
  // undefined): the router, the rank's routed experts in expert order
  // (StageLayout::expert_begin .. expert_end), and Qwen2-MoE's shared expert.
  Tensor router;  // [num_experts, hidden]                  replicated
  std::vector<ExpertWeights> experts;
  Tensor shared_expert_gate;  // [1, hidden]                 replicated, or undefined
  Tensor shared_gate_proj;    // [shared_inter_local, hidden] column-parallel, or undefined
  Tensor shared_up_proj;      // [shared_inter_local, hidden] column-parallel, or undefined
  Tensor shared_down_proj;    // [hidden, shared_inter_local] row-parallel, or undefined
  // FP8 projections kept in FP8 (kernels::Backend::keeps_fp8_weights): the
  // projection above is then F8E4M3 and these are its per-row scales
  // (kernels/linear_fp8.h; worker/model/quantized_weight.h ScalesPerRow),
  // the fused ones holding the parts' scale rows in the parts' row order.
  // Undefined scales for a projection in the compute dtype.
  kernels::Fp8Scales qkv_scales, o_scales, gate_up_scales, down_scales;

  bool sparse() const { return router.defined(); }
};

// Where this rank sits in the model and which slices it holds.
struct StageLayout {
  int first_layer = 0;   // global index of this stage's first layer
  int end_layer = 0;     // one past the last layer
  bool is_first = true;  // holds embed_tokens
  bool is_last = true;   // holds the final norm and lm_head
  int tp = 1;
  int tp_rank = 0;
  int64_t heads_local = 0;
  int64_t kv_heads_local = 0;
  int64_t inter_local = 0;
  // MoE: the routed experts [expert_begin, expert_end) this rank holds, the
  // columns of each it holds, and of the shared expert.
  int64_t expert_begin = 0;
  int64_t expert_end = 0;
  int64_t moe_inter_local = 0;
  int64_t shared_inter_local = 0;
  int64_t vocab_begin = 0;  // first vocab row of this rank's embedding/lm_head slice
  int64_t vocab_local = 0;  // rows per rank (padded vocab / tp)
  int64_t vocab_size = 0;   // real vocab (logits beyond it are padding, dropped)

  int num_layers() const { return end_layer - first_layer; }
};

struct StageWeights {
  StageLayout layout;
  Tensor embed_tokens;               // [vocab_local, hidden], first stage only
  std::vector<LayerWeights> layers;  // [num_layers], index 0 = first_layer
  Tensor final_norm;                 // [hidden], last stage only
  Tensor lm_head;  // [vocab_local, hidden], last stage only (tied: a slice of embed_tokens)
  // Bytes of every tensor above, counted once (a fused tensor is its parts:
  // the views add nothing).
  int64_t weight_bytes = 0;
  // Of weight_bytes: bytes (and tensors) reused from tensors the rank already
  // held (a re-plan that keeps its layers), not read from the checkpoint.
  int64_t reused_bytes = 0;
  int reused_tensors = 0;
  // Bytes of the FP8 values and scales of the quantized projection slices
  // read from an FP8 checkpoint or quantized online (QuantizedWeight::nbytes,
  // worker/model/quantized_weight.h): what a backend that keeps FP8 weights
  // would hold for them. The dense slots above hold them dequantized (fp32 on
  // the CPU), counted in weight_bytes; on a backend that keeps FP8 the slots
  // hold the FP8 values and LayerWeights' scales, counted in weight_bytes
  // too. 0 for a dense model.
  int64_t quantized_bytes = 0;
};

}  // namespace tessera
