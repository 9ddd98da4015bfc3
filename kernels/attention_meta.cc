#include "kernels/attention_meta.h"

#include <algorithm>
#include <cstring>

namespace tessera::kernels {

AttentionMetaLayout MetaLayoutFor(int64_t T, int64_t S, int64_t P) {
  AttentionMetaLayout m;
  m.token_seq = 0;
  m.token_pos = T;
  m.seq_info = 2 * T;
  m.q_indptr = m.seq_info + 4 * S;
  m.kv_indptr = m.q_indptr + S + 1;
  m.kv_last_page_len = m.kv_indptr + S + 1;
  m.decode_chunk = m.kv_last_page_len + S;
  m.decode_o_indptr = m.decode_chunk + 1;
  m.decode_request = m.decode_o_indptr + S + 1;
  m.decode_kv_tile = m.decode_request + P;
  m.decode_valid = m.decode_kv_tile + P;
  m.tables = m.decode_valid + (P + 3) / 4;
  return m;
}

int64_t DecodeWorkItems(int64_t num_seqs, int64_t kv_heads, int64_t multiprocessors) {
  if (multiprocessors <= 0 || kv_heads <= 0) return num_seqs;
  const int64_t target = 2 * multiprocessors;  // CTAs: two waves
  if (num_seqs * kv_heads >= target) return num_seqs;
  return std::max(num_seqs, (target + kv_heads - 1) / kv_heads);
}

int64_t DecodeChunk(std::span<const int64_t> kv_lens, int64_t work_items, int64_t block_size) {
  TESSERA_CHECK(block_size > 0 && work_items >= static_cast<int64_t>(kv_lens.size()));
  const auto round_up = [&](int64_t x) { return (x + block_size - 1) / block_size * block_size; };
  int64_t longest = 0;
  for (int64_t l : kv_lens) longest = std::max(longest, l);
  const int64_t no_split = std::max(round_up(std::max<int64_t>(longest, 1)), block_size);
  if (work_items == static_cast<int64_t>(kv_lens.size())) return no_split;
  const auto items = [&](int64_t chunk) {
    int64_t n = 0;
    for (int64_t l : kv_lens) n += std::max<int64_t>(1, (l + chunk - 1) / chunk);
    return n;
  };
  // Binary search over chunk = k * block_size: items() falls as the chunk grows.
  int64_t lo = std::max<int64_t>(1, round_up(kMinDecodeChunk) / block_size);
  int64_t hi = no_split / block_size;
  if (lo >= hi) return no_split;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (items(mid * block_size) <= work_items) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo * block_size;
}

StatusOr<AttentionBatch> CheckAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                             int64_t block_size, int64_t num_blocks,
                                             int64_t decode_work_items) {
  AttentionBatch b;
  b.num_tokens = num_tokens;
  if (block_size <= 0)
    return InvalidArgument("attention batch: block_size " + std::to_string(block_size));
  const int64_t S = static_cast<int64_t>(seqs.size());
  if (decode_work_items != 0 && decode_work_items < S)
    return InvalidArgument("attention batch: " + std::to_string(decode_work_items) +
                           " decode work items for " + std::to_string(S) + " sequences");
  b.decode_work_items = decode_work_items == 0 ? S : decode_work_items;
  int64_t next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttentionSeq& s = seqs[i];
    if (s.token_begin != next || s.num_tokens < 0 || s.start_pos < 0)
      return InvalidArgument("attention batch: sequence " + std::to_string(i) + " covers rows [" +
                             std::to_string(s.token_begin) + ", " +
                             std::to_string(s.token_begin + s.num_tokens) +
                             "), expected to start at " + std::to_string(next));
    next += s.num_tokens;
    const int64_t ctx = s.start_pos + s.num_tokens;
    const int64_t need = (ctx + block_size - 1) / block_size;
    if (need > static_cast<int64_t>(s.block_table.size()))
      return OutOfRange("kv cache: position " + std::to_string(ctx - 1) + " of sequence " +
                        std::to_string(i) + " needs block index " + std::to_string(need - 1) +
                        " but the block table has " + std::to_string(s.block_table.size()) +
                        " blocks");
    for (int64_t j = 0; j < need; ++j) {
      const int32_t block = s.block_table[static_cast<size_t>(j)];
      if (block < 0 || block >= num_blocks)
        return OutOfRange("kv cache: block id " + std::to_string(block) + " of sequence " +
                          std::to_string(i) + " outside [0, " + std::to_string(num_blocks) + ")");
    }
    b.max_seq_tokens = std::max(b.max_seq_tokens, s.num_tokens);
    b.max_context = std::max(b.max_context, ctx);
  }
  if (next != num_tokens)
    return InvalidArgument("attention batch: sequences cover " + std::to_string(next) +
                           " rows, the step has " + std::to_string(num_tokens));
  b.seqs = std::move(seqs);
  return b;
}

std::vector<int32_t> PackAttentionMeta(const AttentionBatch& b, int64_t block_size,
                                       int64_t table_capacity) {
  const int64_t T = b.num_tokens, S = static_cast<int64_t>(b.seqs.size());
  const int64_t P = std::max(b.decode_work_items, S);
  std::vector<int64_t> kv_lens(static_cast<size_t>(S));
  int64_t tables = 0;
  for (int64_t i = 0; i < S; ++i) {
    const AttentionSeq& s = b.seqs[static_cast<size_t>(i)];
    kv_lens[static_cast<size_t>(i)] = s.start_pos + s.num_tokens;
    tables += (kv_lens[static_cast<size_t>(i)] + block_size - 1) / block_size;
  }
  TESSERA_CHECK(table_capacity == 0 || tables <= table_capacity);
  const AttentionMetaLayout L = MetaLayoutFor(T, S, P);
  std::vector<int32_t> meta(static_cast<size_t>(L.tables + std::max(tables, table_capacity)), 0);
  int32_t* m = meta.data();
  const int64_t chunk = DecodeChunk(kv_lens, P, block_size);
  m[L.decode_chunk] = static_cast<int32_t>(chunk);
  std::vector<uint8_t> valid(static_cast<size_t>(P), 0);
  int64_t off = 0, item = 0;
  for (int64_t i = 0; i < S; ++i) {
    const AttentionSeq& s = b.seqs[static_cast<size_t>(i)];
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      m[L.token_seq + s.token_begin + t] = static_cast<int32_t>(i);
      m[L.token_pos + s.token_begin + t] = static_cast<int32_t>(s.start_pos + t);
    }
    const int64_t ctx = kv_lens[static_cast<size_t>(i)];
    const int64_t need = (ctx + block_size - 1) / block_size;
    int32_t* info = m + L.seq_info + 4 * i;
    info[0] = static_cast<int32_t>(s.token_begin);
    info[1] = static_cast<int32_t>(s.num_tokens);
    info[2] = s.start_pos;
    info[3] = static_cast<int32_t>(off);
    m[L.q_indptr + i] = static_cast<int32_t>(s.token_begin);
    m[L.kv_indptr + i] = static_cast<int32_t>(off);
    m[L.kv_last_page_len + i] = static_cast<int32_t>(ctx - (need - 1) * block_size);
    for (int64_t j = 0; j < need; ++j)
      m[L.tables + off + j] = s.block_table[static_cast<size_t>(j)];
    off += need;
    // Decode work items of this sequence: its context in chunks (one for an empty context).
    m[L.decode_o_indptr + i] = static_cast<int32_t>(item);
    const int64_t chunks = std::max<int64_t>(1, (ctx + chunk - 1) / chunk);
    for (int64_t c = 0; c < chunks; ++c, ++item) {
      m[L.decode_request + item] = static_cast<int32_t>(i);
      m[L.decode_kv_tile + item] = static_cast<int32_t>(c);
      valid[static_cast<size_t>(item)] = 1;
    }
  }
  TESSERA_CHECK(item <= P);
  m[L.q_indptr + S] = static_cast<int32_t>(T);
  m[L.kv_indptr + S] = static_cast<int32_t>(off);
  m[L.decode_o_indptr + S] = static_cast<int32_t>(item);
  if (P > 0) std::memcpy(m + L.decode_valid, valid.data(), valid.size());
  return meta;
}

int64_t DecodeContextBucket(int64_t max_context) {
  int64_t bucket = 256;
  while (bucket < max_context) bucket *= 2;
  return bucket;
}

StatusOr<AttentionBatch> MakeAttentionBatch(std::vector<AttentionSeq> seqs, int64_t num_tokens,
                                            int64_t block_size, int64_t num_blocks,
                                            Backend& backend, int64_t decode_work_items) {
  TESSERA_ASSIGN_OR_RETURN(
      AttentionBatch b,
      CheckAttentionBatch(std::move(seqs), num_tokens, block_size, num_blocks, decode_work_items));
  if (backend.device() != Device::kCPU) {
    std::vector<int32_t> meta = PackAttentionMeta(b, block_size);
    Tensor host = Tensor::Wrap(meta.data(), {static_cast<int64_t>(meta.size())}, DType::kI32,
                               Device::kCPU, nullptr);
    TESSERA_ASSIGN_OR_RETURN(b.device_meta, backend.Upload(host));
  }
  return b;
}

}  // namespace tessera::kernels
