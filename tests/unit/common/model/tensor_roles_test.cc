// The family tensor tables (common/model/tensor_roles.h), checked
//  - for consistency: each role once, in model order, split kinds that fit
//    the shapes, "{layer}" in exactly the per-layer names;
//  - against the fixture checkpoints (tests/fixtures/models/*, written by
//    transformers' save_pretrained through tools/make_fixtures.py): every
//    role a fixture's config implies resolves to a tensor of that name and
//    shape, every tensor of the checkpoint is some role's, and the parameter
//    counts from the table equal the elements in the checkpoint;
//  - for coverage: every role of every family is met in some fixture, except
//    the Llama biases listed in kNotInAnyFixture.
#include "common/model/tensor_roles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/format/checkpoint.h"
#include "common/format/model_config.h"
#include "support/test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Roles of a family that no fixture checkpoint has: the fixtures' Llama
// configs set neither attention_bias nor mlp_bias (adding one needs
// tools/make_fixtures.py, i.e. torch and transformers). These are checked
// against the table's own rules only (and by shard_spec_test's literal
// name list for a biased Llama).
const std::set<std::pair<Architecture, TensorRole>> kNotInAnyFixture = {
    {Architecture::kLlama, TensorRole::kQBias},
    {Architecture::kLlama, TensorRole::kKBias},
    {Architecture::kLlama, TensorRole::kVBias},
    {Architecture::kLlama, TensorRole::kOBias},
    {Architecture::kLlama, TensorRole::kGateBias},
    {Architecture::kLlama, TensorRole::kUpBias},
    {Architecture::kLlama, TensorRole::kDownBias},
    // Qwen3 configs leave attention_bias false (the fixture too).
    {Architecture::kQwen3, TensorRole::kQBias},
    {Architecture::kQwen3, TensorRole::kKBias},
    {Architecture::kQwen3, TensorRole::kVBias},
    {Architecture::kQwen3, TensorRole::kOBias},
    // So do Gemma's (the fixtures' too, as every published Gemma 2 and 3).
    {Architecture::kGemma2, TensorRole::kQBias},
    {Architecture::kGemma2, TensorRole::kKBias},
    {Architecture::kGemma2, TensorRole::kVBias},
    {Architecture::kGemma2, TensorRole::kOBias},
    {Architecture::kGemma3Text, TensorRole::kQBias},
    {Architecture::kGemma3Text, TensorRole::kKBias},
    {Architecture::kGemma3Text, TensorRole::kVBias},
    {Architecture::kGemma3Text, TensorRole::kOBias},
    // Qwen3-MoE as Qwen3.
    {Architecture::kQwen3Moe, TensorRole::kQBias},
    {Architecture::kQwen3Moe, TensorRole::kKBias},
    {Architecture::kQwen3Moe, TensorRole::kVBias},
    {Architecture::kQwen3Moe, TensorRole::kOBias},
};

std::vector<std::string> FixtureModels() {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(testing::FixturePath("models"))) {
    if (e.is_directory()) dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(TensorRoles, EveryArchitectureHasAConsistentTable) {
  ASSERT_EQ(AllArchitectures().size(), 10u);
  for (Architecture arch : AllArchitectures()) {
    SCOPED_TRACE(ArchitectureName(arch));
    const FamilyRoles& family = FamilyRolesOf(arch);
    EXPECT_EQ(family.architecture, arch);
    EXPECT_NE(std::string(family.modeling_file).find("transformers/models/"), std::string::npos);
    ASSERT_FALSE(family.roles.empty());
    std::set<TensorRole> seen;
    int previous = -1;
    for (const RoleSpec& rs : family.roles) {
      SCOPED_TRACE(TensorRoleName(rs.role));
      EXPECT_TRUE(seen.insert(rs.role).second) << "role listed twice";
      EXPECT_GT(static_cast<int>(rs.role), previous) << "not in model order";
      previous = static_cast<int>(rs.role);
      EXPECT_FALSE(std::string(rs.source).empty());
      const std::string name = rs.hf_name;
      EXPECT_EQ(name.find("{layer}") != std::string::npos, rs.place == RolePlace::kLayer) << name;
      ASSERT_TRUE(rs.ndim == 1 || rs.ndim == 2) << name;
      const bool bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
      EXPECT_EQ(bias, rs.condition == RoleCondition::kAttentionBias ||
                          rs.condition == RoleCondition::kMlpBias)
          << name;
      // Per-expert roles name the expert and come from a sparse layer.
      EXPECT_EQ(name.find("{expert}") != std::string::npos, rs.per_expert) << name;
      if (rs.per_expert) {
        EXPECT_EQ(rs.condition, RoleCondition::kSparseLayer) << name;
      }
      switch (rs.split) {
        case SplitKind::kReplicated:
          break;
        case SplitKind::kColumnParallel:
          EXPECT_TRUE(rs.shape[0] == RoleDim::kQueryRows || rs.shape[0] == RoleDim::kKvRows ||
                      rs.shape[0] == RoleDim::kIntermediate ||
                      rs.shape[0] == RoleDim::kMoeIntermediate ||
                      rs.shape[0] == RoleDim::kSharedIntermediate)
              << name;
          break;
        case SplitKind::kRowParallel:
          ASSERT_EQ(rs.ndim, 2) << name;
          EXPECT_TRUE(rs.shape[1] == RoleDim::kQueryRows || rs.shape[1] == RoleDim::kIntermediate ||
                      rs.shape[1] == RoleDim::kMoeIntermediate ||
                      rs.shape[1] == RoleDim::kSharedIntermediate)
              << name;
          break;
        case SplitKind::kVocabParallel:
          EXPECT_EQ(rs.shape[0], RoleDim::kVocab) << name;
          break;
      }
      EXPECT_EQ(rs.add_after_all_reduce, bias && rs.split == SplitKind::kReplicated) << name;
      EXPECT_EQ(rs.tied_to_embedding, rs.role == TensorRole::kLmHead) << name;
      // Fused roles: column-parallel parts of qkv_proj (q, k, v) or
      // gate_up_proj (gate, up), named after the fused tensor.
      switch (rs.fused) {
        case FusedTensor::kNone:
          break;
        case FusedTensor::kQkv:
          EXPECT_TRUE(rs.role == TensorRole::kQProj || rs.role == TensorRole::kKProj ||
                      rs.role == TensorRole::kVProj);
          EXPECT_NE(name.find(".qkv_proj.weight"), std::string::npos) << name;
          EXPECT_EQ(rs.split, SplitKind::kColumnParallel) << name;
          break;
        case FusedTensor::kGateUp:
          EXPECT_TRUE(rs.role == TensorRole::kGateProj || rs.role == TensorRole::kUpProj);
          EXPECT_NE(name.find(".gate_up_proj.weight"), std::string::npos) << name;
          EXPECT_EQ(rs.split, SplitKind::kColumnParallel) << name;
          break;
      }
    }
    // Every family has the roles a decoder needs: a dense MLP, or (a
    // mixture of experts) the router and the routed experts.
    for (TensorRole r :
         {TensorRole::kEmbedTokens, TensorRole::kInputNorm, TensorRole::kQProj, TensorRole::kKProj,
          TensorRole::kVProj, TensorRole::kOProj, TensorRole::kPostAttentionNorm,
          TensorRole::kFinalNorm, TensorRole::kLmHead}) {
      EXPECT_TRUE(seen.count(r)) << TensorRoleName(r);
    }
    const bool moe = seen.count(TensorRole::kRouter) > 0;
    for (TensorRole r : {TensorRole::kGateProj, TensorRole::kUpProj, TensorRole::kDownProj}) {
      if (!moe) {
        EXPECT_TRUE(seen.count(r)) << TensorRoleName(r);
      }
    }
    for (TensorRole r :
         {TensorRole::kExpertGateProj, TensorRole::kExpertUpProj, TensorRole::kExpertDownProj}) {
      EXPECT_EQ(seen.count(r) > 0, moe) << TensorRoleName(r);
    }
  }
}

TEST(TensorRoles, NamesAndShapesResolveAgainstAConfig) {
  ModelConfig m;
  m.architecture = Architecture::kQwen2;
  m.hidden_size = 96;
  m.intermediate_size = 192;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 6;
  m.num_key_value_heads = 2;
  m.head_dim = 16;
  m.vocab_size = 1001;
  m.attention_bias = true;
  m.tie_word_embeddings = true;
  std::map<TensorRole, const RoleSpec*> by_role;
  for (const RoleSpec& rs : FamilyRolesOf(m.architecture).roles) by_role[rs.role] = &rs;
  ASSERT_EQ(by_role.count(TensorRole::kOBias), 0u);  // Qwen2: no o_proj bias
  const RoleSpec& k_bias = *by_role.at(TensorRole::kKBias);
  EXPECT_EQ(RoleTensorName(k_bias, 1), "model.layers.1.self_attn.k_proj.bias");
  EXPECT_EQ(RoleShape(k_bias, m), (std::vector<int64_t>{32}));
  const RoleSpec& o = *by_role.at(TensorRole::kOProj);
  EXPECT_EQ(RoleShape(o, m), (std::vector<int64_t>{96, 96}));
  EXPECT_EQ(RoleNumel(o, m), 96 * 96);
  const RoleSpec& head = *by_role.at(TensorRole::kLmHead);
  EXPECT_TRUE(RoleIsTied(head, m));
  EXPECT_EQ(RoleTensorName(head, -1), "lm_head.weight");
  EXPECT_EQ(RoleSourceName(head, m, -1), "model.embed_tokens.weight");
  EXPECT_EQ(RoleShape(head, m), (std::vector<int64_t>{1001, 96}));
  m.tie_word_embeddings = false;
  EXPECT_EQ(RoleSourceName(head, m, -1), "lm_head.weight");
  m.attention_bias = false;
  EXPECT_FALSE(RolePresent(k_bias, m));

  // q, k, v, o; q/k/v biases; gate, up, down; two norms.
  m.attention_bias = true;
  const int64_t layer = 96 * 96 + 2 * 96 * 32 + 96 * 96 + (96 + 2 * 32) + 3 * 96 * 192 + 2 * 96;
  EXPECT_EQ(LayerParameterCount(m), layer);
  EXPECT_EQ(LayerReplicatedParameterCount(m), 2 * 96);
  EXPECT_EQ(ModelParameterCount(m), 2 * layer + 2 * 1001 * 96 + 96);
  m.tie_word_embeddings = true;
  EXPECT_EQ(ModelParameterCount(m), 2 * layer + 1001 * 96 + 96);
}

TEST(TensorRoles, MistralHasNoBiasesWhateverTheConfigSays) {
  ModelConfig m;
  m.architecture = Architecture::kMistral;
  m.hidden_size = 64;
  m.intermediate_size = 128;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 1;
  m.head_dim = 16;
  m.attention_bias = true;
  m.mlp_bias = true;
  for (const RoleSpec& rs : FamilyRolesOf(Architecture::kMistral).roles) {
    EXPECT_EQ(rs.condition, RoleCondition::kAlways) << TensorRoleName(rs.role);
  }
  EXPECT_EQ(LayerParameterCount(m), 64 * 64 + 2 * 64 * 16 + 64 * 64 + 3 * 64 * 128 + 2 * 64);
  EXPECT_EQ(LayerReplicatedParameterCount(m), 2 * 64);
}

// Every fixture checkpoint holds exactly the tensors its family's table and
// config imply, with the table's shapes; the table's parameter counts equal
// the checkpoint's elements.
TEST(TensorRoles, FixtureCheckpointsHoldExactlyTheTablesTensors) {
  const std::vector<std::string> dirs = FixtureModels();
  ASSERT_GE(dirs.size(), 5u) << testing::FixturePath("models");
  std::set<std::pair<Architecture, TensorRole>> met;
  std::set<Architecture> tied_met, untied_met;
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    const ModelConfig& m = *config;
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    (m.tie_word_embeddings ? tied_met : untied_met).insert(m.architecture);

    std::set<std::string> expected;  // checkpoint tensors the table claims
    // Fused tensors: the rows their parts claim, [begin, end) in claim order.
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> fused_rows;
    std::map<int, int64_t> layer_elements;  // per decoder layer
    auto check = [&](const RoleSpec& rs, int layer, int expert) {
      if (!RolePresentInLayer(rs, m, layer)) return;
      const std::string name = RoleSourceName(rs, m, layer, expert);
      const std::string alt = RoleAltName(rs, layer);
      if (!alt.empty() && !(*ckpt)->Has(name) && (*ckpt)->Has(alt)) {
        // The transformers 5 form: a renamed tensor, or every expert's
        // matrix stacked in one (claimed by each expert's parts).
        auto info = (*ckpt)->Find(alt);
        ASSERT_TRUE(info.ok());
        EXPECT_EQ(info->shape, RoleAltShape(rs, m)) << alt;
        met.insert({m.architecture, rs.role});
        layer_elements[layer] += RoleNumel(rs, m);
        if (rs.alt == AltForm::kRenamed) {
          EXPECT_TRUE(expected.insert(alt).second) << alt << " claimed twice";
        } else {
          expected.insert(alt);
        }
        return;
      }
      auto info = (*ckpt)->Find(name);
      ASSERT_TRUE(info.ok()) << TensorRoleName(rs.role) << ": " << info.status().ToString();
      EXPECT_EQ(info->shape, RoleSourceShape(rs, m)) << name;
      met.insert({m.architecture, rs.role});
      if (RoleIsTied(rs, m)) {
        EXPECT_FALSE((*ckpt)->Has(RoleTensorName(rs, layer))) << "a tied model has no " << name;
        return;  // the embedding's tensor, claimed by kEmbedTokens
      }
      if (layer >= 0) layer_elements[layer] += RoleNumel(rs, m);
      if (rs.fused != FusedTensor::kNone) {
        const int64_t begin = RoleFusedRowOffset(rs, m);
        fused_rows[name].push_back({begin, begin + RoleShape(rs, m)[0]});
        EXPECT_EQ(RoleShape(rs, m)[1], info->shape[1]) << name;
        expected.insert(name);
        return;
      }
      EXPECT_TRUE(expected.insert(name).second) << name << " claimed twice";
    };
    for (const RoleSpec& rs : FamilyRolesOf(m.architecture).roles) {
      if (rs.place != RolePlace::kLayer) {
        check(rs, -1, -1);
        continue;
      }
      for (int layer = 0; layer < m.num_hidden_layers; ++layer) {
        if (!rs.per_expert) {
          check(rs, layer, -1);
          continue;
        }
        for (int e = 0; e < m.num_experts; ++e) check(rs, layer, e);
      }
    }

    // The parts of a fused tensor tile its rows, in order, exactly once.
    for (const auto& [name, parts] : fused_rows) {
      auto info = (*ckpt)->Find(name);
      ASSERT_TRUE(info.ok());
      int64_t next = 0;
      for (const auto& [begin, end] : parts) {
        EXPECT_EQ(begin, next) << name;
        next = end;
      }
      EXPECT_EQ(next, info->shape[0]) << name;
    }

    // An FP8 checkpoint's scale tensors: one per F8_E4M3 projection, which
    // must be a quantizable role's (common/format/quantization.h).
    std::set<std::string> scales;
    for (const std::string& name : expected) {
      auto info = (*ckpt)->Find(name);
      if (!info.ok() || info->dtype != DType::kF8E4M3) continue;
      EXPECT_TRUE(m.quantization.quantized()) << name;
      if (m.quantization.quantized()) scales.insert(m.quantization.ScaleName(name));
    }
    std::vector<std::string> names;
    for (const std::string& name : (*ckpt)->TensorNames()) {
      if (scales.erase(name) == 0) names.push_back(name);
    }
    EXPECT_TRUE(scales.empty()) << "missing scale tensor " << *scales.begin();
    int64_t elements = 0;
    for (const std::string& name : names) {
      EXPECT_TRUE(expected.count(name)) << name << " is in the checkpoint but no role's";
      auto info = (*ckpt)->Find(name);
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      elements += info->NumElements();
    }
    EXPECT_EQ(expected.size(), names.size());
    EXPECT_EQ(ModelParameterCount(m), elements);
    int64_t most = 0;
    for (const auto& [layer, n] : layer_elements) {
      EXPECT_EQ(LayerParameterCount(m, layer), n) << "layer " << layer;
      most = std::max(most, n);
    }
    EXPECT_EQ(LayerParameterCount(m), most);
  }

  for (Architecture arch : AllArchitectures()) {
    for (const RoleSpec& rs : FamilyRolesOf(arch).roles) {
      const bool exempt = kNotInAnyFixture.count({arch, rs.role}) > 0;
      EXPECT_EQ(met.count({arch, rs.role}) > 0, !exempt)
          << ArchitectureName(arch) << " " << TensorRoleName(rs.role)
          << (exempt ? " is now in a fixture: drop it from kNotInAnyFixture"
                     : " is in no fixture checkpoint");
    }
  }
  // Tied and untied lm_head both resolve (Llama has fixtures of each).
  EXPECT_TRUE(tied_met.count(Architecture::kLlama));
  EXPECT_TRUE(untied_met.count(Architecture::kLlama));
}

TEST(TensorRoles, Phi3RolesAreRowsOfTheFusedTensors) {
  ModelConfig m;
  m.architecture = Architecture::kPhi3;
  m.hidden_size = 64;
  m.intermediate_size = 96;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 4;
  m.head_dim = 8;
  m.vocab_size = 512;
  std::map<TensorRole, const RoleSpec*> by_role;
  for (const RoleSpec& rs : FamilyRolesOf(m.architecture).roles) by_role[rs.role] = &rs;
  const RoleSpec& q = *by_role.at(TensorRole::kQProj);
  const RoleSpec& k = *by_role.at(TensorRole::kKProj);
  const RoleSpec& v = *by_role.at(TensorRole::kVProj);
  EXPECT_EQ(RoleTensorName(k, 1), "model.layers.1.self_attn.qkv_proj.weight");
  EXPECT_EQ(RolePartName(k, 1), "model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(RolePartName(*by_role.at(TensorRole::kUpProj), 0), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(RolePartName(*by_role.at(TensorRole::kOProj), 0),
            "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(RoleShape(q, m), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(RoleShape(k, m), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(RoleSourceShape(v, m), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(RoleFusedRowOffset(q, m), 0);
  EXPECT_EQ(RoleFusedRowOffset(k, m), 64);
  EXPECT_EQ(RoleFusedRowOffset(v, m), 96);
  const RoleSpec& gate = *by_role.at(TensorRole::kGateProj);
  const RoleSpec& up = *by_role.at(TensorRole::kUpProj);
  EXPECT_EQ(RoleTensorName(up, 0), "model.layers.0.mlp.gate_up_proj.weight");
  EXPECT_EQ(RoleSourceShape(gate, m), (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(RoleFusedRowOffset(gate, m), 0);
  EXPECT_EQ(RoleFusedRowOffset(up, m), 96);
  // Unfused roles read their own tensor from row 0.
  const RoleSpec& o = *by_role.at(TensorRole::kOProj);
  EXPECT_EQ(RoleFusedRowOffset(o, m), 0);
  EXPECT_EQ(RoleSourceShape(o, m), RoleShape(o, m));
  EXPECT_EQ(by_role.count(TensorRole::kQBias), 0u);  // no biases
  // The parameters are the parts': qkv 128x64, o 64x64, gate_up 192x64,
  // down 64x96, two norms.
  EXPECT_EQ(LayerParameterCount(m), 128 * 64 + 64 * 64 + 192 * 64 + 64 * 96 + 2 * 64);
}

TEST(TensorRoles, Qwen3PerHeadNormsAreReplicatedHeadDimWeights) {
  ModelConfig m;
  m.architecture = Architecture::kQwen3;
  m.hidden_size = 64;
  m.intermediate_size = 128;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 32;
  m.vocab_size = 512;
  std::map<TensorRole, const RoleSpec*> by_role;
  for (const RoleSpec& rs : FamilyRolesOf(m.architecture).roles) by_role[rs.role] = &rs;
  for (TensorRole r : {TensorRole::kQNorm, TensorRole::kKNorm}) {
    const RoleSpec& n = *by_role.at(r);
    EXPECT_EQ(n.split, SplitKind::kReplicated);
    EXPECT_EQ(RoleShape(n, m), (std::vector<int64_t>{32}));
  }
  EXPECT_EQ(RoleTensorName(*by_role.at(TensorRole::kKNorm), 1),
            "model.layers.1.self_attn.k_norm.weight");
  // q [128, 64], k and v [64, 64], o [64, 128], MLP 3 x 128 x 64, two hidden
  // norms and two head norms; the replicated part is the four norms.
  EXPECT_EQ(LayerParameterCount(m),
            128 * 64 + 2 * 64 * 64 + 64 * 128 + 3 * 128 * 64 + 2 * 64 + 2 * 32);
  EXPECT_EQ(LayerReplicatedParameterCount(m), 2 * 64 + 2 * 32);
}

// Gemma: four [hidden] RMSNorms per layer (input, post-attention on the
// attention output, pre- and post-feed-forward), all replicated; Gemma 3 adds
// the per-head q/k norms. Their (1 + weight) scale is a forward-pass property
// (ModelConfig::rms_norm_unit_offset), so the tensors are plain norms.
TEST(TensorRoles, GemmaHasFourHiddenNormsPerLayer) {
  ModelConfig m;
  m.hidden_size = 64;
  m.intermediate_size = 96;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 32;
  m.vocab_size = 512;
  m.num_hidden_layers = 3;
  m.tie_word_embeddings = true;
  for (Architecture arch : {Architecture::kGemma2, Architecture::kGemma3Text}) {
    SCOPED_TRACE(ArchitectureName(arch));
    m.architecture = arch;
    std::map<TensorRole, const RoleSpec*> by_role;
    for (const RoleSpec& rs : FamilyRolesOf(arch).roles) by_role[rs.role] = &rs;
    for (TensorRole r : {TensorRole::kInputNorm, TensorRole::kPostAttentionNorm,
                         TensorRole::kPreFeedforwardNorm, TensorRole::kPostFeedforwardNorm}) {
      const RoleSpec& n = *by_role.at(r);
      EXPECT_EQ(n.split, SplitKind::kReplicated);
      EXPECT_EQ(RoleShape(n, m), (std::vector<int64_t>{64}));
    }
    EXPECT_EQ(RoleTensorName(*by_role.at(TensorRole::kPreFeedforwardNorm), 2),
              "model.layers.2.pre_feedforward_layernorm.weight");
    EXPECT_EQ(RoleTensorName(*by_role.at(TensorRole::kPostFeedforwardNorm), 0),
              "model.layers.0.post_feedforward_layernorm.weight");
    const bool head_norms = arch == Architecture::kGemma3Text;
    EXPECT_EQ(by_role.count(TensorRole::kQNorm), head_norms ? 1u : 0u);
    EXPECT_EQ(by_role.count(TensorRole::kKNorm), head_norms ? 1u : 0u);
    EXPECT_TRUE(RoleIsTied(*by_role.at(TensorRole::kLmHead), m));
    // q [128, 64], k and v [64, 64], o [64, 128], MLP 3 x 96 x 64, four
    // hidden norms (+ two head norms).
    const int64_t norms = 4 * 64 + (head_norms ? 2 * 32 : 0);
    EXPECT_EQ(LayerParameterCount(m), 128 * 64 + 2 * 64 * 64 + 64 * 128 + 3 * 96 * 64 + norms);
    EXPECT_EQ(LayerReplicatedParameterCount(m), norms);
    // Three layers, the embedding (the tied head adds nothing), the final norm.
    EXPECT_EQ(ModelParameterCount(m), 3 * LayerParameterCount(m) + 512 * 64 + 64);
  }
}

TEST(TensorRoles, RoleAndSplitNames) {
  EXPECT_STREQ(TensorRoleName(TensorRole::kEmbedTokens), "embed_tokens");
  EXPECT_STREQ(TensorRoleName(TensorRole::kQBias), "q_proj.bias");
  EXPECT_STREQ(TensorRoleName(TensorRole::kPostAttentionNorm), "post_attention_layernorm");
  EXPECT_STREQ(TensorRoleName(TensorRole::kFinalNorm), "norm");
  EXPECT_STREQ(TensorRoleName(TensorRole::kLmHead), "lm_head");
  EXPECT_STREQ(TensorRoleName(TensorRole::kQNorm), "q_norm");
  EXPECT_STREQ(TensorRoleName(TensorRole::kKNorm), "k_norm");
  EXPECT_STREQ(TensorRoleName(TensorRole::kPreFeedforwardNorm), "pre_feedforward_layernorm");
  EXPECT_STREQ(TensorRoleName(TensorRole::kPostFeedforwardNorm), "post_feedforward_layernorm");
  std::set<std::string> names;
  for (int r = 0; r < kNumTensorRoles; ++r) {
    names.insert(TensorRoleName(static_cast<TensorRole>(r)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumTensorRoles));
  EXPECT_EQ(names.count("?"), 0u);
}

}  // namespace
}  // namespace tessera
