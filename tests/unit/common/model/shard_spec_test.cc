#include "common/model/shard_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tessera {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Model shapes (real configs' numbers; no weights are touched).

ModelConfig Llama3_8B() {  // GQA 32/8, untied
  ModelConfig m;
  m.architecture = Architecture::kLlama;
  m.hidden_size = 4096;
  m.intermediate_size = 14336;
  m.num_hidden_layers = 32;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 8;
  m.head_dim = 128;
  m.vocab_size = 128256;
  return m;
}

ModelConfig Llama2_7B() {  // MHA 32/32
  ModelConfig m = Llama3_8B();
  m.intermediate_size = 11008;
  m.num_key_value_heads = 32;
  m.vocab_size = 32000;
  return m;
}

ModelConfig Mistral7B() {
  ModelConfig m = Llama3_8B();
  m.architecture = Architecture::kMistral;
  m.vocab_size = 32000;
  return m;
}

ModelConfig Llama32_1B() {  // GQA 32/8, tied, head_dim 64
  ModelConfig m = Llama3_8B();
  m.hidden_size = 2048;
  m.intermediate_size = 8192;
  m.num_hidden_layers = 16;
  m.head_dim = 64;
  m.tie_word_embeddings = true;
  return m;
}

ModelConfig Qwen25_1_5B() {  // 12 heads / 2 KV heads, tied, q/k/v bias
  ModelConfig m;
  m.architecture = Architecture::kQwen2;
  m.hidden_size = 1536;
  m.intermediate_size = 8960;
  m.num_hidden_layers = 28;
  m.num_attention_heads = 12;
  m.num_key_value_heads = 2;
  m.head_dim = 128;
  m.vocab_size = 151936;
  m.tie_word_embeddings = true;
  m.attention_bias = true;
  return m;
}

// Llama with every bias and a vocab not divisible by 2 or 4 (32001, as
// Llama-2 fine-tunes with an added pad token have).
ModelConfig OddVocabBiasedLlama() {
  ModelConfig m;
  m.architecture = Architecture::kLlama;
  m.hidden_size = 2048;
  m.intermediate_size = 5632;
  m.num_hidden_layers = 6;
  m.num_attention_heads = 16;
  m.num_key_value_heads = 4;
  m.head_dim = 128;
  m.vocab_size = 32001;
  m.attention_bias = true;
  m.mlp_bias = true;
  return m;
}

// ---------------------------------------------------------------------------
// The expected whole-model tensor list, from the family's tensor table
// (common/model/tensor_roles.h; tensor_roles_test checks the tables against
// the fixture checkpoints). What is checked here is how ShardSpec splits the
// table's tensors over stages and tp ranks.

struct FullTensor {
  std::string role;  // TensorShard::role_name
  std::string name;  // checkpoint tensor
  std::vector<int64_t> shape;
  SplitKind kind;
  bool add_after_all_reduce = false;
  int layer = -1;  // -1: embed (stage 0) / -2: norm, lm_head (last stage)
  TensorRole typed = TensorRole::kEmbedTokens;
  bool kv_rows = false;  // dim 0 is KV-head rows (replicated when kv < tp)
};

std::vector<FullTensor> FullTensors(const ModelConfig& m) {
  std::vector<FullTensor> out;
  auto add = [&](const RoleSpec& rs, int layer, int stage_marker) {
    if (!RolePresent(rs, m)) return;
    out.push_back({RoleTensorName(rs, layer), RoleSourceName(rs, m, layer), RoleShape(rs, m),
                   rs.split, rs.add_after_all_reduce, layer < 0 ? stage_marker : layer, rs.role,
                   rs.shape[0] == RoleDim::kKvRows});
  };
  const FamilyRoles& family = FamilyRolesOf(m.architecture);
  for (const RoleSpec& rs : family.roles) {
    if (rs.place == RolePlace::kFirstStage) add(rs, -1, -1);
  }
  for (int l = 0; l < m.num_hidden_layers; ++l) {
    for (const RoleSpec& rs : family.roles) {
      if (rs.place == RolePlace::kLayer) add(rs, l, l);
    }
  }
  for (const RoleSpec& rs : family.roles) {
    if (rs.place == RolePlace::kLastStage) add(rs, -1, -2);
  }
  return out;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return n;
}

// Bytes of the checkpoint: every distinct checkpoint tensor once.
int64_t FullModelBytes(const ModelConfig& m, DType dtype) {
  std::set<std::string> names;
  int64_t n = 0;
  for (const FullTensor& t : FullTensors(m)) {
    if (names.insert(t.name).second) n += Numel(t.shape);
  }
  return n * static_cast<int64_t>(DTypeSize(dtype));
}

// Bytes of one decoder layer in the checkpoint.
int64_t LayerBytes(const ModelConfig& m, DType dtype) {
  int64_t n = 0;
  for (const FullTensor& t : FullTensors(m)) {
    if (t.layer == 0) n += Numel(t.shape);
  }
  return n * static_cast<int64_t>(DTypeSize(dtype));
}

// What tp sharding adds to one decoder layer, summed over the stage's tp
// ranks: replicated tensors (norms, row-parallel biases) held on every rank,
// KV heads held tp / kv times when kv < tp.
int64_t LayerOverheadBytes(const ModelConfig& m, int tp, DType dtype) {
  const int64_t kv = m.num_key_value_heads;
  int64_t n = 0;
  for (const FullTensor& t : FullTensors(m)) {
    if (t.layer != 0) continue;
    if (t.kind == SplitKind::kReplicated) n += Numel(t.shape) * (tp - 1);
    if (t.kv_rows && kv < tp) n += Numel(t.shape) * (tp / kv - 1);
  }
  return n * static_cast<int64_t>(DTypeSize(dtype));
}

// What tp x pp sharding adds on top of the checkpoint, summed over ranks.
int64_t ReplicationOverheadBytes(const ModelConfig& m, int tp, int pp, DType dtype) {
  const int64_t h = m.hidden_size;
  int64_t n = h * (tp - 1);  // model.norm
  const int64_t vp = (m.vocab_size + tp - 1) / tp * tp;
  if (!m.tie_word_embeddings) {
    n += 2 * (vp - m.vocab_size) * h;  // embed + lm_head padding
  } else {
    n += (vp - m.vocab_size) * h;  // embed padding
    if (pp > 1) n += vp * h;       // the last stage's padded lm_head copy
  }
  return n * static_cast<int64_t>(DTypeSize(dtype)) +
         m.num_hidden_layers * LayerOverheadBytes(m, tp, dtype);
}

struct Layout {
  int tp, pp;
};
const Layout kLayouts[] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {1, 3}, {2, 2}};

struct NamedModel {
  const char* name;
  ModelConfig config;
  // Embedding and lm_head are a small part of the bytes, so every rank holds
  // close to 1/(tp*pp) of the model even with pp > 1.
  bool layer_dominated;
};
std::vector<NamedModel> Models() {
  return {{"Llama-3-8B (GQA)", Llama3_8B(), true},
          {"Llama-2-7B (MHA)", Llama2_7B(), true},
          {"Mistral-7B", Mistral7B(), true},
          {"Llama-3.2-1B (tied)", Llama32_1B(), false},
          {"Qwen2.5-1.5B (kv<tp, tied, bias)", Qwen25_1_5B(), false},
          {"Llama vocab 32001 + biases", OddVocabBiasedLlama(), false}};
}

std::vector<ShardSpec> AllRanks(const ModelConfig& m, const ParallelConfig& pc) {
  std::vector<ShardSpec> specs;
  for (int rank = 0; rank < pc.world_size(); ++rank) {
    auto spec = ShardSpec::Make(m, pc, rank);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    if (spec.ok()) specs.push_back(std::move(spec).value());
  }
  return specs;
}

// ---------------------------------------------------------------------------

// For every model and layout: each tensor is on exactly one stage, replicated
// tensors are on every rank of it, split tensors' ranges tile the tensor
// exactly once (KV heads tp/kv times when replicated), kinds and local shapes
// follow the rules.
TEST(ShardSpec, RangesCoverEveryTensorExactlyOnce) {
  for (const NamedModel& nm : Models()) {
    const ModelConfig& m = nm.config;
    for (const Layout& lay : kLayouts) {
      SCOPED_TRACE(::testing::Message() << nm.name << " tp=" << lay.tp << " pp=" << lay.pp);
      auto pc = ParallelConfig::Make(m, lay.tp, lay.pp);
      ASSERT_TRUE(pc.ok()) << pc.status().ToString();
      const std::vector<ShardSpec> specs = AllRanks(m, *pc);
      ASSERT_EQ(specs.size(), static_cast<size_t>(pc->world_size()));

      struct Held {
        int stage, tp_rank;
        const TensorShard* shard;
      };
      std::map<std::string, std::vector<Held>> by_role;
      for (const ShardSpec& s : specs) {
        // GQA consistency: query head qh uses KV head qh / group; it must be
        // among the KV heads this rank's k_proj / v_proj rows hold.
        const std::string l0 = "model.layers." + std::to_string(s.first_layer()) + ".self_attn.";
        auto q = s.Find(l0 + "q_proj.weight");
        auto k = s.Find(l0 + "k_proj.weight");
        auto v = s.Find(l0 + "v_proj.weight");
        ASSERT_TRUE(q.ok() && k.ok() && v.ok()) << s.ToString();
        const int64_t group = m.num_attention_heads / m.num_key_value_heads;
        for (int64_t qh = (*q)->begin / m.head_dim; qh < (*q)->end / m.head_dim; ++qh) {
          EXPECT_GE(qh / group, (*k)->begin / m.head_dim) << "query head " << qh;
          EXPECT_LT(qh / group, (*k)->end / m.head_dim) << "query head " << qh;
        }
        EXPECT_EQ((*k)->begin, s.kv_head_begin() * m.head_dim);
        EXPECT_EQ((*k)->end - (*k)->begin, s.local_kv_heads() * m.head_dim);
        EXPECT_EQ((*v)->begin, (*k)->begin);
        EXPECT_EQ((*v)->end, (*k)->end);
        std::set<std::string> roles;
        for (const TensorShard& t : s.tensors()) {
          EXPECT_TRUE(roles.insert(t.role_name).second) << "role twice on rank " << s.rank();
          by_role[t.role_name].push_back({s.stage(), s.tp_rank(), &t});
          auto found = s.Find(t.role_name);
          ASSERT_TRUE(found.ok()) << found.status().ToString();
          EXPECT_EQ(*found, &t);
          auto typed = s.Find(t.role, t.layer);
          ASSERT_TRUE(typed.ok()) << typed.status().ToString();
          EXPECT_EQ(*typed, &t);
        }
      }

      const std::vector<FullTensor> full = FullTensors(m);
      EXPECT_EQ(by_role.size(), full.size()) << "the ranks hold roles the model does not have";
      for (const FullTensor& f : full) {
        SCOPED_TRACE(f.role);
        auto it = by_role.find(f.role);
        ASSERT_NE(it, by_role.end()) << "no rank holds it";
        const std::vector<Held>& held = it->second;
        const int want_stage = f.layer == -1   ? 0
                               : f.layer == -2 ? pc->pp - 1
                                               : pc->StageOfLayer(f.layer);
        ASSERT_EQ(held.size(), static_cast<size_t>(pc->tp)) << "not on every tp rank of one stage";
        std::set<int> tp_ranks;
        for (const Held& h : held) {
          EXPECT_EQ(h.stage, want_stage);
          tp_ranks.insert(h.tp_rank);
          const TensorShard& t = *h.shard;
          EXPECT_EQ(t.name, f.name);
          EXPECT_EQ(t.role, f.typed);
          EXPECT_EQ(t.layer, f.layer < 0 ? -1 : f.layer);
          EXPECT_EQ(t.full_shape, f.shape);
          EXPECT_EQ(t.kind, f.kind);
          EXPECT_EQ(t.add_after_all_reduce, f.add_after_all_reduce);
          std::vector<int64_t> want_local = f.shape;
          switch (f.kind) {
            case SplitKind::kReplicated:
              EXPECT_EQ(t.split_dim, -1);
              break;
            case SplitKind::kColumnParallel:
              EXPECT_EQ(t.split_dim, 0);
              want_local[0] = t.end - t.begin;
              break;
            case SplitKind::kRowParallel:
              EXPECT_EQ(t.split_dim, 1);
              want_local[1] = t.end - t.begin;
              break;
            case SplitKind::kVocabParallel:
              EXPECT_EQ(t.split_dim, 0);
              want_local[0] = (m.vocab_size + pc->tp - 1) / pc->tp;
              EXPECT_LE(t.end - t.begin, want_local[0]);
              break;
          }
          EXPECT_EQ(t.local_shape, want_local);
        }
        EXPECT_EQ(tp_ranks.size(), static_cast<size_t>(pc->tp));
        if (f.kind == SplitKind::kReplicated) continue;

        // Distinct ranges, each held `copies` times, must tile [0, extent).
        const int copies =
            f.kv_rows && m.num_key_value_heads < pc->tp ? pc->tp / m.num_key_value_heads : 1;
        std::map<std::pair<int64_t, int64_t>, int> ranges;
        for (const Held& h : held) {
          if (h.shard->end > h.shard->begin) ++ranges[{h.shard->begin, h.shard->end}];
        }
        int64_t next = 0;
        for (const auto& [range, count] : ranges) {
          EXPECT_EQ(range.first, next) << "gap or overlap at " << next;
          EXPECT_EQ(count, copies) << "range [" << range.first << ", " << range.second << ")";
          next = range.second;
        }
        EXPECT_EQ(next, f.shape[f.kind == SplitKind::kRowParallel ? 1 : 0]);
      }
    }
  }
}

// Sum over ranks of held bytes == checkpoint bytes + replication overhead;
// the tp ranks of a stage hold the same bytes; each rank holds ~1/(tp*pp).
TEST(ShardSpec, WeightBytesAddUpAndBalance) {
  for (const NamedModel& nm : Models()) {
    const ModelConfig& m = nm.config;
    for (const Layout& lay : kLayouts) {
      SCOPED_TRACE(::testing::Message() << nm.name << " tp=" << lay.tp << " pp=" << lay.pp);
      auto pc = ParallelConfig::Make(m, lay.tp, lay.pp);
      ASSERT_TRUE(pc.ok()) << pc.status().ToString();
      const std::vector<ShardSpec> specs = AllRanks(m, *pc);
      ASSERT_EQ(specs.size(), static_cast<size_t>(pc->world_size()));
      for (DType dtype : {DType::kBF16, DType::kF32}) {
        int64_t sum = 0;
        for (const ShardSpec& s : specs) sum += s.WeightBytes(dtype);
        EXPECT_EQ(sum,
                  FullModelBytes(m, dtype) + ReplicationOverheadBytes(m, lay.tp, lay.pp, dtype));
      }
      const int64_t layer_bytes = LayerBytes(m, DType::kBF16);
      const int64_t layer_overhead = LayerOverheadBytes(m, lay.tp, DType::kBF16);
      const double ideal = static_cast<double>(FullModelBytes(m, DType::kBF16)) / pc->world_size();
      for (const ShardSpec& s : specs) {
        SCOPED_TRACE(s.ToString());
        EXPECT_EQ(s.WeightBytes(DType::kBF16),
                  specs[pc->WorldRank(s.stage(), 0)].WeightBytes(DType::kBF16))
            << "differs from its stage's tp_rank 0";
        // The decoder-layer part is exactly the stage's layers / tp: a share
        // of 1/(tp*pp) up to the uneven layer split.
        int64_t held_layer_numel = 0;
        for (const TensorShard& t : s.tensors()) {
          if (t.name.rfind("model.layers.", 0) == 0) held_layer_numel += t.local_numel();
        }
        const int64_t stage_layers = s.end_layer() - s.first_layer();
        EXPECT_EQ(held_layer_numel * 2 * lay.tp, stage_layers * (layer_bytes + layer_overhead));
        if (nm.layer_dominated) {
          const double ratio = s.WeightBytes(DType::kBF16) / ideal;
          EXPECT_GT(ratio, 0.8);
          EXPECT_LT(ratio, 1.25);
        }
      }
    }
  }
}

TEST(ShardSpec, SingleRankHoldsTheWholeModelInOrder) {
  ModelConfig m = OddVocabBiasedLlama();
  m.num_hidden_layers = 1;
  auto pc = ParallelConfig::Make(m, 1, 1);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  auto spec = ShardSpec::Make(m, *pc, 0);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  std::vector<std::string> names;
  for (const TensorShard& t : spec->tensors()) names.push_back(t.name);
  const std::string p = "model.layers.0.";
  EXPECT_EQ(
      names,
      (std::vector<std::string>{
          "model.embed_tokens.weight", p + "input_layernorm.weight", p + "self_attn.q_proj.weight",
          p + "self_attn.q_proj.bias", p + "self_attn.k_proj.weight", p + "self_attn.k_proj.bias",
          p + "self_attn.v_proj.weight", p + "self_attn.v_proj.bias", p + "self_attn.o_proj.weight",
          p + "self_attn.o_proj.bias", p + "post_attention_layernorm.weight",
          p + "mlp.gate_proj.weight", p + "mlp.gate_proj.bias", p + "mlp.up_proj.weight",
          p + "mlp.up_proj.bias", p + "mlp.down_proj.weight", p + "mlp.down_proj.bias",
          "model.norm.weight", "lm_head.weight"}));
  EXPECT_EQ(spec->WeightBytes(DType::kBF16), FullModelBytes(m, DType::kBF16));
  for (const TensorShard& t : spec->tensors()) {
    if (t.split_dim >= 0) {
      EXPECT_EQ(t.begin, 0) << t.name;
      EXPECT_EQ(t.end, t.full_shape[t.split_dim]) << t.name;
    }
    EXPECT_EQ(t.local_shape, t.full_shape) << t.name;
  }
}

TEST(ShardSpec, GqaHeadRangesWithTp4) {
  auto pc = ParallelConfig::Make(Llama3_8B(), 4, 1);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  for (int r = 0; r < 4; ++r) {
    auto s = ShardSpec::Make(Llama3_8B(), *pc, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->local_heads(), 8);
    EXPECT_EQ(s->local_kv_heads(), 2);
    EXPECT_EQ(s->kv_head_begin(), 2 * r);
    EXPECT_FALSE(s->kv_replicated());
    EXPECT_EQ(s->local_intermediate(), 3584);
    auto q = s->Find("model.layers.5.self_attn.q_proj.weight");
    ASSERT_TRUE(q.ok());
    EXPECT_EQ((*q)->begin, r * 8 * 128);
    EXPECT_EQ((*q)->end, (r + 1) * 8 * 128);
    EXPECT_EQ((*q)->local_shape, (std::vector<int64_t>{1024, 4096}));
    auto k = s->Find("model.layers.5.self_attn.k_proj.weight");
    ASSERT_TRUE(k.ok());
    EXPECT_EQ((*k)->begin, r * 2 * 128);
    EXPECT_EQ((*k)->end, (r + 1) * 2 * 128);
    auto o = s->Find("model.layers.5.self_attn.o_proj.weight");
    ASSERT_TRUE(o.ok());
    EXPECT_EQ((*o)->split_dim, 1);
    EXPECT_EQ((*o)->begin, r * 1024);
    EXPECT_EQ((*o)->local_shape, (std::vector<int64_t>{4096, 1024}));
    auto down = s->Find("model.layers.5.mlp.down_proj.weight");
    ASSERT_TRUE(down.ok());
    EXPECT_EQ((*down)->begin, r * 3584);
    EXPECT_EQ((*down)->local_shape, (std::vector<int64_t>{4096, 3584}));
  }
}

// tp = [4, 2]: each rank splits by its own stage's tp. Stage 0 (world ranks
// 0..3) holds 8 query heads and a quarter of the embedding per rank; stage 1
// (world ranks 4..5) holds 16 heads and half of lm_head per rank.
TEST(ShardSpec, PerStageTpSplitsEachStageByItsOwnTp) {
  const ModelConfig m = Llama3_8B();
  auto pc = ParallelConfig::MakePerStage(m, {4, 2});
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  ASSERT_EQ(pc->world_size(), 6);
  for (int r = 0; r < 6; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    auto s = ShardSpec::Make(m, *pc, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const int stage = r < 4 ? 0 : 1;
    const int tp = stage == 0 ? 4 : 2;
    const int t = stage == 0 ? r : r - 4;
    EXPECT_EQ(s->stage(), stage);
    EXPECT_EQ(s->tp_rank(), t);
    EXPECT_EQ(s->local_heads(), 32 / tp);
    EXPECT_EQ(s->local_kv_heads(), 8 / tp);
    EXPECT_EQ(s->kv_head_begin(), t * 8 / tp);
    EXPECT_EQ(s->local_intermediate(), 14336 / tp);
    EXPECT_EQ(s->vocab_padded(), 128256);  // a multiple of both 4 and 2
    EXPECT_EQ(s->vocab_begin(), t * 128256 / tp);
    EXPECT_EQ(s->vocab_end(), (t + 1) * 128256 / tp);
    const int layer = stage == 0 ? 0 : 31;
    auto q = s->Find("model.layers." + std::to_string(layer) + ".self_attn.q_proj.weight");
    ASSERT_TRUE(q.ok());
    EXPECT_EQ((*q)->begin, t * (32 / tp) * 128);
    EXPECT_EQ((*q)->local_shape, (std::vector<int64_t>{32 / tp * 128, 4096}));
    EXPECT_TRUE(s->Find(stage == 0 ? "model.embed_tokens.weight" : "lm_head.weight").ok());
  }
}

// kv_head = (r * local_heads) / (heads / kv_heads).
TEST(ShardSpec, KvHeadsReplicatedWhenFewerThanTp) {
  // Qwen2.5-1.5B, tp=4: 3 query heads per rank, group of 6 query heads per KV head.
  const ModelConfig qwen = Qwen25_1_5B();
  auto pc = ParallelConfig::Make(qwen, 4, 1);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  const int64_t want_kv[] = {0, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    auto s = ShardSpec::Make(qwen, *pc, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(s->kv_replicated());
    EXPECT_EQ(s->local_heads(), 3);
    EXPECT_EQ(s->local_kv_heads(), 1);
    EXPECT_EQ(s->kv_head_begin(), want_kv[r]) << "rank " << r;
    for (const char* name :
         {"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.bias"}) {
      auto t = s->Find(name);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      EXPECT_EQ((*t)->begin, want_kv[r] * 128) << name;
      EXPECT_EQ((*t)->end, (want_kv[r] + 1) * 128) << name;
      EXPECT_EQ((*t)->local_shape[0], 128) << name;
    }
    // Every query head of this rank uses the held KV head (GQA: q / group).
    for (int64_t qh = r * 3; qh < (r + 1) * 3; ++qh) EXPECT_EQ(qh / 6, want_kv[r]);
  }

  // 12 heads, 2 KV heads, tp=6: 2 query heads per rank -> KV heads 0,0,0,1,1,1.
  ModelConfig m = qwen;
  m.intermediate_size = 8964;
  auto pc6 = ParallelConfig::Make(m, 6, 1);
  ASSERT_TRUE(pc6.ok()) << pc6.status().ToString();
  const int64_t want6[] = {0, 0, 0, 1, 1, 1};
  for (int r = 0; r < 6; ++r) {
    auto s = ShardSpec::Make(m, *pc6, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->kv_head_begin(), want6[r]) << "rank " << r;
  }
}

TEST(ShardSpec, VocabPaddedToMultipleOfTp) {
  const ModelConfig m = OddVocabBiasedLlama();  // vocab 32001
  auto pc = ParallelConfig::Make(m, 4, 1);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  struct Want {
    int64_t begin, end, valid;
  };
  const Want want[] = {
      {0, 8001, 8001}, {8001, 16002, 8001}, {16002, 24003, 8001}, {24003, 32001, 7998}};
  for (int r = 0; r < 4; ++r) {
    auto s = ShardSpec::Make(m, *pc, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->vocab_padded(), 32004);
    EXPECT_EQ(s->vocab_begin(), r * 8001);
    EXPECT_EQ(s->vocab_end(), (r + 1) * 8001);
    EXPECT_EQ(s->vocab_valid_rows(), want[r].valid);
    for (const char* role : {"model.embed_tokens.weight", "lm_head.weight"}) {
      auto t = s->Find(role);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      EXPECT_EQ((*t)->kind, SplitKind::kVocabParallel);
      EXPECT_EQ((*t)->begin, want[r].begin) << role;
      EXPECT_EQ((*t)->end, want[r].end) << role;
      EXPECT_EQ((*t)->local_shape, (std::vector<int64_t>{8001, 2048})) << role;
    }
  }
}

TEST(ShardSpec, TinyVocabLeavesLastRankAllPadding) {
  ModelConfig m = OddVocabBiasedLlama();
  m.vocab_size = 5;  // tp=4: padded 8, 2 rows a rank; rank 3 holds rows 6, 7
  auto pc = ParallelConfig::Make(m, 4, 1);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  auto s = ShardSpec::Make(m, *pc, 3);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->vocab_valid_rows(), 0);
  auto t = s->Find("lm_head.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->begin, 5);
  EXPECT_EQ((*t)->end, 5);
  EXPECT_EQ((*t)->local_shape, (std::vector<int64_t>{2, 2048}));
  auto s2 = ShardSpec::Make(m, *pc, 2);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2->vocab_valid_rows(), 1);
}

TEST(ShardSpec, TiedEmbeddingsLoadedOnFirstAndLastStage) {
  const ModelConfig m = Llama32_1B();
  auto pc = ParallelConfig::Make(m, 2, 2);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  for (int rank = 0; rank < 4; ++rank) {
    auto s = ShardSpec::Make(m, *pc, rank);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (const TensorShard& t : s->tensors()) EXPECT_NE(t.name, "lm_head.weight");
    auto embed = s->Find("model.embed_tokens.weight");
    auto head = s->Find("lm_head.weight");
    if (s->stage() == 0) {
      ASSERT_TRUE(embed.ok());
      EXPECT_EQ((*embed)->role_name, "model.embed_tokens.weight");
      EXPECT_EQ((*embed)->role, TensorRole::kEmbedTokens);
      EXPECT_EQ(head.status().code(), StatusCode::kNotFound);
      EXPECT_EQ(head.status().message(), "tensor 'lm_head.weight' is not held by rank " +
                                             std::to_string(rank) + " (stage 0, tp_rank " +
                                             std::to_string(rank % 2) +
                                             ", layers [0, 8), first stage)");
    } else {
      EXPECT_EQ(embed.status().code(), StatusCode::kNotFound);
      ASSERT_TRUE(head.ok()) << head.status().ToString();
      EXPECT_EQ((*head)->name, "model.embed_tokens.weight");
      EXPECT_EQ((*head)->role_name, "lm_head.weight");
      EXPECT_EQ((*head)->role, TensorRole::kLmHead);
      EXPECT_EQ((*head)->begin, s->tp_rank() * 64128);
      EXPECT_EQ((*head)->end, (s->tp_rank() + 1) * 64128);
    }
  }

  // pp == 1: two bindings of one slice, held once.
  auto pc1 = ParallelConfig::Make(m, 2, 1);
  ASSERT_TRUE(pc1.ok());
  auto s = ShardSpec::Make(m, *pc1, 1);
  ASSERT_TRUE(s.ok());
  auto embed = s->Find("model.embed_tokens.weight");
  auto head = s->Find("lm_head.weight");
  ASSERT_TRUE(embed.ok() && head.ok());
  EXPECT_NE(*embed, *head);
  EXPECT_EQ((*head)->name, (*embed)->name);
  EXPECT_EQ((*head)->begin, (*embed)->begin);
  int64_t numel_all = 0;
  for (const TensorShard& t : s->tensors()) numel_all += t.local_numel();
  EXPECT_EQ(s->WeightBytes(DType::kBF16), 2 * (numel_all - (*head)->local_numel()));
}

// Find(role, layer) and Find(name) return the same shard; a role the rank
// does not hold is named with its layer.
TEST(ShardSpec, TypedFindMatchesTheHfName) {
  const ModelConfig m = Llama32_1B();  // tied, 16 layers
  auto pc = ParallelConfig::Make(m, 2, 2);
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  auto s = ShardSpec::Make(m, *pc, 3);  // stage 1, tp_rank 1: layers [8, 16)
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto by_role = s->Find(TensorRole::kKProj, 9);
  auto by_name = s->Find("model.layers.9.self_attn.k_proj.weight");
  ASSERT_TRUE(by_role.ok() && by_name.ok());
  EXPECT_EQ(*by_role, *by_name);
  EXPECT_EQ((*by_role)->layer, 9);
  auto head = s->Find(TensorRole::kLmHead);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(*head, *s->Find("lm_head.weight"));
  EXPECT_EQ((*head)->name, "model.embed_tokens.weight");

  auto missing = s->Find(TensorRole::kKProj, 3);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "tensor 'k_proj' of layer 3 is not held by rank 3 (stage 1, tp_rank 1, layers [8, "
            "16), last stage)");
  auto no_embed = s->Find(TensorRole::kEmbedTokens);
  EXPECT_EQ(no_embed.status().message(),
            "tensor 'embed_tokens' is not held by rank 3 (stage 1, tp_rank 1, layers [8, 16), "
            "last stage)");
  // A per-layer role asked for without a layer is not held either.
  EXPECT_EQ(s->Find(TensorRole::kQProj).status().code(), StatusCode::kNotFound);
}

TEST(ShardSpec, BiasesFollowTheirLayers) {
  // Qwen2: q/k/v bias, no o_proj bias.
  const ModelConfig qwen = Qwen25_1_5B();
  auto pc = ParallelConfig::Make(qwen, 2, 1);
  ASSERT_TRUE(pc.ok());
  auto s = ShardSpec::Make(qwen, *pc, 1);
  ASSERT_TRUE(s.ok());
  for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
    const std::string base = std::string("model.layers.3.self_attn.") + proj;
    auto w = s->Find(base + ".weight");
    auto b = s->Find(base + ".bias");
    ASSERT_TRUE(w.ok() && b.ok()) << base;
    EXPECT_EQ((*b)->kind, SplitKind::kColumnParallel);
    EXPECT_EQ((*b)->begin, (*w)->begin);
    EXPECT_EQ((*b)->end, (*w)->end);
    EXPECT_FALSE((*b)->add_after_all_reduce);
  }
  EXPECT_EQ(s->Find("model.layers.3.self_attn.o_proj.bias").status().code(), StatusCode::kNotFound);

  // Llama with attention_bias and mlp_bias: row-parallel biases held whole.
  const ModelConfig llama = OddVocabBiasedLlama();
  auto pcl = ParallelConfig::Make(llama, 4, 1);
  ASSERT_TRUE(pcl.ok());
  auto sl = ShardSpec::Make(llama, *pcl, 2);
  ASSERT_TRUE(sl.ok());
  for (const char* name :
       {"model.layers.1.self_attn.o_proj.bias", "model.layers.1.mlp.down_proj.bias"}) {
    auto b = sl->Find(name);
    ASSERT_TRUE(b.ok()) << name;
    EXPECT_EQ((*b)->kind, SplitKind::kReplicated);
    EXPECT_EQ((*b)->split_dim, -1);
    EXPECT_TRUE((*b)->add_after_all_reduce);
    EXPECT_EQ((*b)->local_shape, (std::vector<int64_t>{2048}));
  }
  auto gate_b = sl->Find("model.layers.1.mlp.gate_proj.bias");
  ASSERT_TRUE(gate_b.ok());
  EXPECT_EQ((*gate_b)->begin, 2 * 1408);
  EXPECT_EQ((*gate_b)->end, 3 * 1408);

  // Mistral has no biases whatever attention_bias says.
  ModelConfig mistral = Mistral7B();
  mistral.attention_bias = true;
  mistral.mlp_bias = true;
  auto pcm = ParallelConfig::Make(mistral, 1, 1);
  ASSERT_TRUE(pcm.ok());
  auto sm = ShardSpec::Make(mistral, *pcm, 0);
  ASSERT_TRUE(sm.ok());
  for (const TensorShard& t : sm->tensors()) {
    EXPECT_EQ(t.name.find(".bias"), std::string::npos) << t.name;
  }
}

TEST(ShardSpec, UnevenStagesHoldOnlyTheirLayers) {
  const ModelConfig m = OddVocabBiasedLlama();  // 6 layers
  auto pc = ParallelConfig::Make(m, 1, 3, {1, 4, 1});
  ASSERT_TRUE(pc.ok()) << pc.status().ToString();
  auto s = ShardSpec::Make(m, *pc, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->first_layer(), 1);
  EXPECT_EQ(s->end_layer(), 5);
  EXPECT_FALSE(s->is_first_stage());
  EXPECT_FALSE(s->is_last_stage());
  std::set<int> layers;
  for (const TensorShard& t : s->tensors()) {
    ASSERT_EQ(t.name.rfind("model.layers.", 0), 0u) << t.name;
    layers.insert(std::stoi(t.name.substr(13)));
  }
  EXPECT_EQ(layers, (std::set<int>{1, 2, 3, 4}));
  EXPECT_EQ(s->ToString(),
            "rank 1 (stage 1, tp_rank 0): layers [1, 5), 64 tensors, heads 16, kv_heads 4 from 0, "
            "vocab rows [0, 32001)");
}

TEST(ShardSpec, RejectsBadRankAndConfig) {
  const ModelConfig m = Llama3_8B();
  auto pc = ParallelConfig::Make(m, 2, 2);
  ASSERT_TRUE(pc.ok());
  for (int rank : {-1, 4}) {
    auto s = ShardSpec::Make(m, *pc, rank);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message(),
              "rank " + std::to_string(rank) +
                  " is outside [0, 4) for ParallelConfig{tp=2, pp=2, world_size=4, "
                  "layers_per_stage=[16, 16]}");
  }

  ParallelConfig bad = *pc;
  bad.tp = 3;
  auto s = ShardSpec::Make(m, bad, 0);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("tp=3 does not divide num_attention_heads=32"));

  ModelConfig no_vocab = m;
  no_vocab.vocab_size = 0;
  auto sv = ShardSpec::Make(no_vocab, *pc, 0);
  EXPECT_EQ(sv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(sv.status().message(), HasSubstr("vocab_size=0"));
}

// Qwen3's q_norm / k_norm normalise each head with one [head_dim] weight, so
// every tp rank holds the whole weight and normalises its own heads: the norm
// needs no communication and no slicing, whatever the tp.
TEST(ShardSpec, Qwen3HeadNormsAreWholeOnEveryRank) {
  ModelConfig m;  // Qwen3-0.6B's attention: 16 heads, 8 KV heads, head_dim 128
  m.architecture = Architecture::kQwen3;
  m.hidden_size = 1024;
  m.intermediate_size = 3072;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 16;
  m.num_key_value_heads = 8;
  m.head_dim = 128;
  m.vocab_size = 1000;
  m.tie_word_embeddings = true;
  for (int tp : {1, 2, 4, 8, 16}) {
    auto pc = ParallelConfig::Make(m, tp, 1);
    ASSERT_TRUE(pc.ok()) << pc.status().ToString();
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(::testing::Message() << "tp=" << tp << " rank " << r);
      auto spec = ShardSpec::Make(m, *pc, r);
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      for (TensorRole role : {TensorRole::kQNorm, TensorRole::kKNorm}) {
        auto t = spec->Find(role, 1);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        EXPECT_EQ((*t)->kind, SplitKind::kReplicated);
        EXPECT_EQ((*t)->split_dim, -1);
        EXPECT_EQ((*t)->local_shape, (std::vector<int64_t>{128}));
      }
      EXPECT_EQ((*spec->Find("model.layers.0.self_attn.q_norm.weight"))->role, TensorRole::kQNorm);
      // q_proj: rows of this rank's heads, 128 per head (head_dim decoupled).
      auto q = spec->Find(TensorRole::kQProj, 0);
      ASSERT_TRUE(q.ok());
      EXPECT_EQ((*q)->begin, r * (16 / tp) * 128);
      EXPECT_EQ((*q)->end, (r + 1) * (16 / tp) * 128);
      EXPECT_EQ((*q)->full_shape, (std::vector<int64_t>{2048, 1024}));
    }
  }
}

TEST(ShardSpec, SplitKindNames) {
  EXPECT_STREQ(SplitKindName(SplitKind::kReplicated), "replicated");
  EXPECT_STREQ(SplitKindName(SplitKind::kColumnParallel), "column-parallel");
  EXPECT_STREQ(SplitKindName(SplitKind::kRowParallel), "row-parallel");
  EXPECT_STREQ(SplitKindName(SplitKind::kVocabParallel), "vocab-parallel");
}

}  // namespace
}  // namespace tessera
