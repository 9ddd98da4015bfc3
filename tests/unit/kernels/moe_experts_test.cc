// The grouped expert operations on the CPU (kernels/moe_experts.h), the
// reference of the CUDA kernels: the sort's offsets and permutation, the
// grouped gate|up and down products and the combine against the pair-by-pair
// formula (tests/support/moe_reference.h), with all experts held and with a
// subset (expert parallelism), with a shared expert; and the errors naming
// what is wrong.
#include "kernels/moe_experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kernels/backend.h"
#include "kernels/moe_down_combine.h"
#include "kernels/moe_routing.h"
#include "support/moe_reference.h"

namespace tessera::kernels {
namespace {

Tensor Random(std::vector<int64_t> shape, uint64_t seed, float stddev = 1.0f) {
  Tensor t = Tensor::Empty(std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

struct Case {
  int64_t tokens = 7, hidden = 24, inter = 12, experts = 5, top_k = 3;
  Tensor x, ids, weights;
  std::vector<testing::MoeRefExpert> all;
};

Case MakeCase() {
  Case c;
  c.x = Random({c.tokens, c.hidden}, 1);
  for (int64_t e = 0; e < c.experts; ++e)
    c.all.push_back({Random({c.inter, c.hidden}, 10 + e, 0.3f),
                     Random({c.inter, c.hidden}, 20 + e, 0.3f),
                     Random({c.hidden, c.inter}, 30 + e, 0.3f)});
  Tensor logits = Random({c.tokens, c.experts}, 2);
  c.ids = Tensor::Empty({c.tokens, c.top_k}, DType::kI32);
  c.weights = Tensor::Empty({c.tokens, c.top_k});
  TESSERA_CHECK(MoeTopK(logits, c.top_k, true, c.ids, c.weights).ok());
  return c;
}

// The expert table of held experts [begin, end).
StatusOr<MoeExpertTable> TableOf(const Case& c, int64_t begin, int64_t end) {
  std::vector<Tensor> gate, up, down;
  for (int64_t e = begin; e < end; ++e) {
    gate.push_back(c.all[static_cast<size_t>(e)].gate);
    up.push_back(c.all[static_cast<size_t>(e)].up);
    down.push_back(c.all[static_cast<size_t>(e)].down);
  }
  return MakeMoeExpertTable(CpuBackend(), gate, up, down);
}

// The grouped path over held experts [begin, end), with an optional shared expert.
std::vector<float> Grouped(const Case& c, int64_t begin, int64_t end, const Tensor& shared,
                           const Tensor& shared_gate, Tensor* totals) {
  auto table = TableOf(c, begin, end);
  EXPECT_TRUE(table.ok()) << table.status().ToString();
  MoeRouting r;
  EXPECT_TRUE(MoeSortByExpert(CpuBackend(), c.ids, begin, end, r, totals).ok());
  const int64_t slots = c.tokens * c.top_k;
  Tensor act = Tensor::Empty({slots, c.inter}), y = Tensor::Empty({slots, c.hidden});
  Tensor out = Tensor::Empty({c.tokens, c.hidden});
  EXPECT_TRUE(MoeGroupedGateUp(c.x, *table, r, act).ok());
  EXPECT_TRUE(MoeGroupedDown(act, *table, r, y).ok());
  EXPECT_TRUE(MoeCombine(y, r, c.weights, shared, shared_gate, out).ok());
  return std::vector<float>(out.data<float>(), out.data<float>() + out.numel());
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::abs(want[i])) << "element " << i;
}

TEST(MoeExperts, RouteIsTheTopKThenTheSort) {
  Tensor logits = Random({6, 9}, 3);
  Tensor ids = Tensor::Empty({6, 2}, DType::kI32), w = Tensor::Empty({6, 2});
  Tensor want_ids = Tensor::Empty({6, 2}, DType::kI32), want_w = Tensor::Empty({6, 2});
  ASSERT_TRUE(MoeTopK(logits, 2, false, want_ids, want_w).ok());
  MoeRouting want, got;
  Tensor want_totals = Tensor::Zeros({5}, DType::kI64),
         got_totals = Tensor::Zeros({5}, DType::kI64);
  ASSERT_TRUE(MoeSortByExpert(CpuBackend(), want_ids, 2, 7, want, &want_totals).ok());
  ASSERT_TRUE(MoeRoute(CpuBackend(), logits, 2, false, 2, 7, ids, w, got, &got_totals).ok());
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() &&
           std::equal(a.data<int32_t>(), a.data<int32_t>() + a.numel(), b.data<int32_t>());
  };
  EXPECT_TRUE(same(ids, want_ids));
  EXPECT_TRUE(std::equal(w.data<float>(), w.data<float>() + w.numel(), want_w.data<float>()));
  EXPECT_TRUE(same(got.expert_rows, want.expert_rows));
  EXPECT_TRUE(same(got.token_slot, want.token_slot));
  const int32_t* want_active = want.active.data<int32_t>();
  ASSERT_GT(want_active[0], 0);
  EXPECT_TRUE(
      std::equal(want_active, want_active + 1 + want_active[0], got.active.data<int32_t>()));
  EXPECT_TRUE(std::equal(got_totals.data<int64_t>(), got_totals.data<int64_t>() + 5,
                         want_totals.data<int64_t>()));
  // The top-k's and the sort's errors, each naming its tensor.
  Tensor short_ids = Tensor::Empty({6, 1}, DType::kI32);
  Status s = MoeRoute(CpuBackend(), logits, 2, false, 0, 9, short_ids, w, got, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = MoeRoute(CpuBackend(), logits, 2, false, 4, 4, ids, w, got, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("held experts [4, 4)"), std::string::npos) << s.ToString();
}

TEST(MoeExperts, SortGivesEachHeldExpertItsPairsInTokenOrder) {
  const Case c = MakeCase();
  MoeRouting r;
  Tensor totals = Tensor::Zeros({3}, DType::kI64);
  ASSERT_TRUE(MoeSortByExpert(CpuBackend(), c.ids, 1, 4, r, &totals).ok());
  ASSERT_TRUE(MoeSortByExpert(CpuBackend(), c.ids, 1, 4, r, &totals).ok());  // totals add up
  const int32_t* rows = r.expert_rows.data<int32_t>();
  int64_t held_pairs = 0;
  std::vector<int32_t> want_active;  // the held experts with pairs, ascending
  for (int64_t e = 1; e < 4; ++e) {
    std::vector<int32_t> want;  // the tokens routed to e, in token order
    for (int64_t i = 0; i < c.ids.numel(); ++i)
      if (c.ids.data<int32_t>()[i] == e) want.push_back(static_cast<int32_t>(i / c.top_k));
    const std::vector<int32_t> got(r.slot_token.data<int32_t>() + rows[e - 1],
                                   r.slot_token.data<int32_t>() + rows[e]);
    EXPECT_EQ(got, want) << "expert " << e;
    EXPECT_EQ(totals.data<int64_t>()[e - 1], 2 * static_cast<int64_t>(want.size()));
    if (!want.empty()) want_active.push_back(static_cast<int32_t>(e - 1));
    held_pairs += static_cast<int64_t>(want.size());
  }
  EXPECT_EQ(rows[0], 0);
  EXPECT_EQ(rows[3], held_pairs);
  const int32_t* active = r.active.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(active + 1, active + 1 + active[0]), want_active);
  for (int64_t i = 0; i < c.ids.numel(); ++i) {
    const int32_t id = c.ids.data<int32_t>()[i], slot = r.token_slot.data<int32_t>()[i];
    if (id < 1 || id >= 4) {
      EXPECT_EQ(slot, -1) << "pair " << i << " of expert " << id << " is another rank's";
    } else {
      ASSERT_GE(slot, rows[id - 1]);
      ASSERT_LT(slot, rows[id]);
      EXPECT_EQ(r.slot_token.data<int32_t>()[slot], i / c.top_k);
    }
  }
}

TEST(MoeExperts, GroupedExpertsMatchThePairByPairFormula) {
  const Case c = MakeCase();
  const std::vector<float> want =
      testing::MoeReference(c.x, c.ids, c.weights, c.all, 0, Tensor(), Tensor(), DType::kF32);
  ExpectNear(Grouped(c, 0, c.experts, Tensor(), Tensor(), nullptr), want);
}

TEST(MoeExperts, ExpertParallelRanksSumToTheWholeLayer) {
  const Case c = MakeCase();
  // Experts 5 over 2 ranks: [0, 3) and [3, 5); each rank's part is the
  // reference over its experts, and the parts sum to the whole.
  const std::vector<float> a = Grouped(c, 0, 3, Tensor(), Tensor(), nullptr);
  const std::vector<float> b = Grouped(c, 3, 5, Tensor(), Tensor(), nullptr);
  const std::vector<testing::MoeRefExpert> first(c.all.begin(), c.all.begin() + 3);
  const std::vector<testing::MoeRefExpert> second(c.all.begin() + 3, c.all.end());
  ExpectNear(
      a, testing::MoeReference(c.x, c.ids, c.weights, first, 0, Tensor(), Tensor(), DType::kF32));
  ExpectNear(
      b, testing::MoeReference(c.x, c.ids, c.weights, second, 3, Tensor(), Tensor(), DType::kF32));
  std::vector<float> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  ExpectNear(
      sum, testing::MoeReference(c.x, c.ids, c.weights, c.all, 0, Tensor(), Tensor(), DType::kF32));
}

TEST(MoeExperts, CombineAddsTheSigmoidGatedSharedExpert) {
  const Case c = MakeCase();
  const Tensor shared = Random({c.tokens, c.hidden}, 5), gate = Random({c.tokens, 1}, 6);
  ExpectNear(Grouped(c, 0, c.experts, shared, gate, nullptr),
             testing::MoeReference(c.x, c.ids, c.weights, c.all, 0, shared, gate, DType::kF32));
}

TEST(MoeExperts, ErrorsNameTheExpertAndTheTensor) {
  const Case c = MakeCase();
  std::vector<Tensor> gate = {c.all[0].gate, c.all[1].gate};
  std::vector<Tensor> up = {c.all[0].up, Random({c.inter + 1, c.hidden}, 9)};
  std::vector<Tensor> down = {c.all[0].down, c.all[1].down};
  auto bad = MakeMoeExpertTable(CpuBackend(), gate, up, down);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("held expert 1 up_proj"), std::string::npos)
      << bad.status().ToString();
  up[1] = c.all[1].up;
  auto table = MakeMoeExpertTable(CpuBackend(), gate, up, down);
  ASSERT_TRUE(table.ok());
  MoeRouting r;
  ASSERT_TRUE(MoeSortByExpert(CpuBackend(), c.ids, 0, 2, r, nullptr).ok());
  Tensor act = Tensor::Empty({c.tokens * c.top_k, c.inter + 2});
  Status s = MoeGroupedGateUp(c.x, *table, r, act);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("moe activations"), std::string::npos) << s.ToString();
  Tensor wrong_k = Tensor::Empty({c.tokens, 2}, DType::kI32);
  std::fill_n(wrong_k.data<int32_t>(), wrong_k.numel(), 0);
  EXPECT_FALSE(MoeSortByExpert(CpuBackend(), wrong_k, 0, 0, r, nullptr).ok());
}

// MoeDownCombine (kernels/moe_down_combine.h) on the CPU: the two calls it stands for, over a
// subset of the experts (pairs of the others skipped) with a shared expert; a wrong expert-id
// tensor is named.
TEST(MoeExperts, DownCombineIsTheDownProductThenTheCombine) {
  const Case c = MakeCase();
  const Tensor shared = Random({c.tokens, c.hidden}, 5), shared_gate = Random({c.tokens, 1}, 6);
  auto table = TableOf(c, 1, 4);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  MoeRouting r;
  ASSERT_TRUE(MoeSortByExpert(CpuBackend(), c.ids, 1, 4, r, nullptr).ok());
  const int64_t slots = c.tokens * c.top_k;
  Tensor act = Tensor::Empty({slots, c.inter}), y = Tensor::Empty({slots, c.hidden});
  Tensor two = Tensor::Empty({c.tokens, c.hidden}), one = Tensor::Empty({c.tokens, c.hidden});
  ASSERT_TRUE(MoeGroupedGateUp(c.x, *table, r, act).ok());
  ASSERT_TRUE(MoeGroupedDown(act, *table, r, y).ok());
  ASSERT_TRUE(MoeCombine(y, r, c.weights, shared, shared_gate, two).ok());
  Status s =
      MoeDownCombine(CpuBackend(), act, *table, r, c.ids, 1, c.weights, shared, shared_gate, one);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int64_t i = 0; i < two.numel(); ++i)
    ASSERT_EQ(one.data<float>()[i], two.data<float>()[i]) << "element " << i;
  const std::vector<testing::MoeRefExpert> held(c.all.begin() + 1, c.all.begin() + 4);
  ExpectNear(
      std::vector<float>(one.data<float>(), one.data<float>() + one.numel()),
      testing::MoeReference(c.x, c.ids, c.weights, held, 1, shared, shared_gate, DType::kF32));
  const Tensor short_ids = Tensor::Empty({c.tokens, c.top_k - 1}, DType::kI32);
  s = MoeDownCombine(CpuBackend(), act, *table, r, short_ids, 1, c.weights, shared, shared_gate,
                     one);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expert ids"), std::string::npos) << s.ToString();
  s = MoeDownCombine(CpuBackend(), act, *table, r, c.ids, 1, c.weights, shared, Tensor(), one);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("shared expert gate"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace tessera::kernels
