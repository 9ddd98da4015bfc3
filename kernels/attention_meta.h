// The layout of one step's sequences for paged attention (kernels/paged_attention.h): which rows of
// q/k/v belong to which sequence, where each sequence's KV blocks are, and, for FlashInfer's
// kernels (kernels/flashinfer_launch.h), the page arrays and the decode work split they read.
//
// A step processes a flat batch of tokens from several sequences with no padding: sequence s
// covers rows [token_begin, token_begin + num_tokens) of q/k/v and its first token is at absolute
// position start_pos (the number of tokens already in its cache). Its block table maps position p
// to block block_table[p / block_size], slot p % block_size.
//
// Everything here is host code (no device, no CUDA): the layout is packed into I32 values on the
// host and uploaded once per step (eagerly, or into a decode graph's fixed input buffer).
//
// Thread-safety: stateless functions; an AttentionBatch is a value owned by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/base/tensor.h"
#include "kernels/backend.h"

namespace tessera::kernels {

struct AttentionSeq {
  int64_t token_begin = 0;               // first row in the step's q/k/v
  int64_t num_tokens = 0;                // rows of this sequence in the step
  int32_t start_pos = 0;                 // absolute position of the first row
  std::span<const int32_t> block_table;  // covers positions [0, start_pos + num_tokens)
};

// Offsets (in I32 values) of the regions of the packed layout of a step of T tokens, S
// sequences and P decode work items (PackAttentionMeta). The formula lives in MetaLayoutFor only.
//   token_seq        [T]      sequence index of every token
//   token_pos        [T]      absolute position of every token
//   seq_info         [S, 4]   token_begin, num_tokens, start_pos, offset of its block table
//   q_indptr         [S + 1]  token_begin of every sequence, then T (FlashInfer's qo/o indptr)
//   kv_indptr        [S + 1]  offset of every block table in `tables`, then the total (pages)
//   kv_last_page_len [S]      positions used in the sequence's last block (1..block_size)
//   decode_chunk     [1]      positions per decode work item (FlashInfer's kv_chunk_size)
//   decode_o_indptr  [S + 1]  first work item of every sequence, then the number of items
//   decode_request   [P]      sequence of every work item (padding: 0)
//   decode_kv_tile   [P]      chunk of the sequence's context of every work item (padding: 0)
//   decode_valid     [P bytes, in ceil(P / 4) values]  1 for a real work item, 0 for padding
//   tables           the block tables, concatenated in sequence order (then zeros up to the
//                    capacity, for a decode graph)
struct AttentionMetaLayout {
  int64_t token_seq = 0, token_pos = 0, seq_info = 0, q_indptr = 0, kv_indptr = 0,
          kv_last_page_len = 0, decode_chunk = 0, decode_o_indptr = 0, decode_request = 0,
          decode_kv_tile = 0, decode_valid = 0, tables = 0;
};
AttentionMetaLayout MetaLayoutFor(int64_t num_tokens, int64_t num_seqs, int64_t decode_work_items);

// The layout of one step's sequences, built once per forward step and shared by every layer's
// WriteKv and PagedAttention. On a CUDA backend it also holds the packed layout (above) as one
// device I32 tensor, uploaded once per step, not once per layer.
struct AttentionBatch {
  std::vector<AttentionSeq> seqs;
  int64_t num_tokens = 0;         // T: rows of q/k/v
  int64_t max_seq_tokens = 0;     // largest num_tokens of a sequence
  int64_t max_context = 0;        // largest start_pos + num_tokens
  int64_t decode_work_items = 0;  // P >= S: FlashInfer decode CTAs per kv head (0 on the CPU)
  Tensor device_meta;             // I32 packed layout on the backend's device, or undefined
};

// FlashInfer's decode work split: how many work items (CTAs per kv head) a decode step of
// `num_seqs` sequences gets on a device of `multiprocessors` SMs with `kv_heads` kv heads per rank.
// num_seqs when the sequences alone fill two waves (or the device is not a GPU: multiprocessors
// 0); otherwise enough items for two waves, so long contexts are split (flash-decoding, Dao et
// al. 2023). A function of its arguments only, so a decode graph recorded for a batch size keeps
// its grid.
int64_t DecodeWorkItems(int64_t num_seqs, int64_t kv_heads, int64_t multiprocessors);

// The positions per decode work item for contexts `kv_lens` with at most `work_items` items:
// the smallest multiple of block_size, at least kMinDecodeChunk, for which
// sum(max(1, ceil(kv_len / chunk))) <= work_items. The longest context rounded up to
// block_size (no split) when work_items == kv_lens.size() or when that is shorter.
// Preconditions (TESSERA_CHECKed): work_items >= kv_lens.size(), block_size > 0.
inline constexpr int64_t kMinDecodeChunk = 64;
int64_t DecodeChunk(std::span<const int64_t> kv_lens, int64_t work_items, int64_t block_size);

// Checks and packs `seqs` for a cache of `num_blocks` blocks of `block_size` positions, with
// `decode_work_items` FlashInfer decode work items (0: one per sequence). The block tables are
// referenced, not copied: they must outlive the batch. Errors: kInvalidArgument when the
// sequences do not tile [0, num_tokens) in order or decode_work_items is below the number of
// sequences; kOutOfRange when a position has no block in its table or a block id lies outside
// [0, num_blocks) (naming both).
StatusOr<AttentionBatch> MakeAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                            int64_t block_size, int64_t num_blocks,
                                            Backend& backend, int64_t decode_work_items = 0);

// MakeAttentionBatch without the upload: checks `seqs` and fills num_tokens, max_seq_tokens,
// max_context and decode_work_items (device_meta stays undefined). Errors: as MakeAttentionBatch.
StatusOr<AttentionBatch> CheckAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                             int64_t block_size, int64_t num_blocks,
                                             int64_t decode_work_items = 0);

// The I32 values of the packed layout of `batch` (AttentionMetaLayout) for a cache of
// `block_size`. With table_capacity > 0 the tables region holds table_capacity values (the block
// tables packed from its start, zeros after): the layout of a CUDA graph, whose pointers and
// sizes must not change between steps. table_capacity must hold every sequence's blocks
// (TESSERA_CHECKed).
std::vector<int32_t> PackAttentionMeta(const AttentionBatch& batch, int64_t block_size,
                                       int64_t table_capacity = 0);

// The context length by which Tessera's CUDA decode kernel splits its work (flash-decoding):
// the smallest power of two >= 256 holding max_context. Eager steps and recorded decode graphs
// (whose split is fixed when they are recorded) both split by it, so a replayed graph computes
// bit for bit what an eager step computes.
int64_t DecodeContextBucket(int64_t max_context);

}  // namespace tessera::kernels
