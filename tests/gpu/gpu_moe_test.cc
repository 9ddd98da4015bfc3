// GPU tests of the MoE layer's kernels (tessera_gpu_test; issue 32's GPU
// part): the router top-k against the CPU top-k, the grouped expert GEMMs and
// the combine against the pair-by-pair formula (tests/support/moe_reference.h)
// per dtype, with all experts held and a subset (expert parallelism), a
// shared expert, decode and prefill token counts, the 16-byte and the scalar
// load paths; and the whole grouped path recorded as a CUDA graph and replayed
// on new routings. The fixtures (Models.FixturesOnCudaMatchTransformers,
// DecodeGraphs.*, Nccl.TensorParallelFixturesMatchTp1) run the MoE models.
#include <cstring>

#include "gpu/gpu_test_util.h"
#include "kernels/cuda_launch.h"
#include "kernels/moe_down_combine.h"
#include "kernels/moe_experts.h"
#include "kernels/moe_routing.h"
#include "support/moe_reference.h"

namespace tessera {
namespace {

class MoeKernels : public ::testing::TestWithParam<DType> {};

Tensor HostI32(const std::vector<int32_t>& v, std::vector<int64_t> shape) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Router logits of random scale, with exact ties in some rows (the lower
// expert id must win, as on the CPU).
Tensor RouterLogits(int64_t tokens, int64_t experts, uint64_t seed) {
  Tensor l = Random({tokens, experts}, seed, DType::kF32, 2.0f).f32;
  for (int64_t t = 0; t < tokens; t += 3) {
    float* row = l.data<float>() + t * experts;
    row[experts - 1] = row[0];
    if (experts > 4) row[2] = row[1];
  }
  return l;
}

TEST(MoeRouterKernels, TopKMatchesCpu) {
  kernels::Backend& g = Gpu(DType::kF32);
  struct Shape {
    int64_t tokens, experts, top_k;
  };
  for (const Shape sh : {Shape{1, 5, 3}, Shape{7, 8, 2}, Shape{64, 60, 4}, Shape{33, 128, 8},
                         Shape{5, 6, 1}, Shape{3, 300, 6}}) {
    for (bool renorm : {false, true}) {
      const Tensor logits = RouterLogits(sh.tokens, sh.experts, 10 + sh.experts);
      Tensor ids = Tensor::Empty({sh.tokens, sh.top_k}, DType::kI32);
      Tensor w = Tensor::Empty({sh.tokens, sh.top_k});
      ASSERT_TRUE(kernels::MoeTopK(logits, sh.top_k, renorm, ids, w).ok());
      Tensor ids_dev = Dev(g, {sh.tokens, sh.top_k}, DType::kI32);
      Tensor w_dev = Dev(g, {sh.tokens, sh.top_k}, DType::kF32);
      Status s = kernels::MoeTopK(Up(g, logits), sh.top_k, renorm, ids_dev, w_dev);
      ASSERT_TRUE(s.ok()) << s.ToString();
      auto got_ids = g.ToHost(ids_dev);
      ASSERT_TRUE(got_ids.ok());
      const std::string what = "top-" + std::to_string(sh.top_k) + " of " +
                               std::to_string(sh.experts) + (renorm ? " renormalized" : "");
      for (int64_t i = 0; i < ids.numel(); ++i)
        ASSERT_EQ(got_ids->data<int32_t>()[i], ids.data<int32_t>()[i]) << what << " pair " << i;
      ExpectClose(Down(g, w_dev), Vec(w), DType::kF32, what + " weights");
    }
  }
  // A shape error is refused before any launch, naming the tensor.
  Tensor logits_dev = Dev(g, {2, 4}, DType::kF32);
  Tensor ids_dev = Dev(g, {2, 3}, DType::kI32), w_dev = Dev(g, {2, 2}, DType::kF32);
  Status s = kernels::MoeTopK(logits_dev, 3, true, ids_dev, w_dev);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

// The fused top-k + sort of small steps (MoeRouteKernel) gives the CPU's top-k and sort bit for
// bit (the ids, the routing, an expert's slots in pair order), and its weights within rounding;
// steps past its limits run the two kernels.
TEST(MoeRouterKernels, FusedRouteMatchesTheCpusTopKAndSort) {
  kernels::Backend& g = Gpu(DType::kF32);
  struct Shape {
    int64_t tokens, experts, top_k, begin, end;
  };
  const Shape shapes[] = {{1, 8, 2, 0, 8},       {1, 128, 8, 0, 128},  {3, 128, 8, 32, 96},
                          {8, 128, 8, 0, 128},   {8, 60, 4, 7, 53},    {5, 6, 1, 0, 6},
                          {2, 300, 6, 100, 300}, {8, 512, 32, 0, 512}, {9, 128, 8, 0, 128},
                          {4, 1000, 2, 0, 1000}};
  uint64_t seed = 70;
  for (const Shape sh : shapes) {
    for (bool renorm : {false, true}) {
      const std::string what = std::to_string(sh.tokens) + " tokens, top-" +
                               std::to_string(sh.top_k) + " of " + std::to_string(sh.experts) +
                               " held [" + std::to_string(sh.begin) + ", " +
                               std::to_string(sh.end) + ")" + (renorm ? " renormalized" : "");
      const bool fused =
          kernels::cuda::MoeRouteApplies(sh.tokens, sh.experts, sh.top_k, sh.end - sh.begin);
      EXPECT_EQ(fused, sh.tokens <= 8 && sh.experts <= 512) << what;
      const Tensor logits = RouterLogits(sh.tokens, sh.experts, seed++);
      const int64_t held = sh.end - sh.begin;
      Tensor ids = Tensor::Empty({sh.tokens, sh.top_k}, DType::kI32);
      Tensor w = Tensor::Empty({sh.tokens, sh.top_k});
      Tensor totals = Tensor::Zeros({held}, DType::kI64);
      kernels::MoeRouting want;
      ASSERT_TRUE(kernels::MoeRoute(kernels::CpuBackend(), logits, sh.top_k, renorm, sh.begin,
                                    sh.end, ids, w, want, &totals)
                      .ok());
      Tensor ids_dev = Dev(g, {sh.tokens, sh.top_k}, DType::kI32);
      Tensor w_dev = Dev(g, {sh.tokens, sh.top_k}, DType::kF32);
      Tensor totals_dev = Up(g, Tensor::Zeros({held}, DType::kI64));
      kernels::MoeRouting got;
      Status s = kernels::MoeRoute(g, Up(g, logits), sh.top_k, renorm, sh.begin, sh.end, ids_dev,
                                   w_dev, got, &totals_dev);
      ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
      auto got_ids = g.ToHost(ids_dev);
      auto rows = g.ToHost(got.expert_rows);
      auto token_slot = g.ToHost(got.token_slot);
      auto slot_token = g.ToHost(got.slot_token);
      auto active = g.ToHost(got.active);
      auto got_totals = g.ToHost(totals_dev);
      ASSERT_TRUE(got_ids.ok() && rows.ok() && token_slot.ok() && slot_token.ok() && active.ok() &&
                  got_totals.ok());
      auto expect_same = [&](const Tensor& a, const Tensor& b, int64_t n, const char* name) {
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(a.data<int32_t>()[i], b.data<int32_t>()[i]) << what << ": " << name << " " << i;
      };
      expect_same(*got_ids, ids, ids.numel(), "id");
      expect_same(*rows, want.expert_rows, held + 1, "expert_rows");
      const int32_t held_pairs = want.expert_rows.data<int32_t>()[held];
      if (fused) {  // pair order inside an expert, as the CPU's
        expect_same(*token_slot, want.token_slot, ids.numel(), "token_slot");
        expect_same(*slot_token, want.slot_token, held_pairs, "slot_token");
      }
      for (int64_t i = 0; i < ids.numel(); ++i) {  // either order: each pair's slot is its own
        const int32_t sl = token_slot->data<int32_t>()[i];
        ASSERT_EQ(sl < 0, want.token_slot.data<int32_t>()[i] < 0) << what << " pair " << i;
        if (sl >= 0) {
          ASSERT_EQ(slot_token->data<int32_t>()[sl], i / sh.top_k) << what << " pair " << i;
        }
      }
      expect_same(*active, want.active, 1 + want.active.data<int32_t>()[0], "active");
      for (int64_t e = 0; e < held; ++e)
        ASSERT_EQ(got_totals->data<int64_t>()[e], totals.data<int64_t>()[e]) << what << " " << e;
      ExpectClose(Down(g, w_dev), Vec(w), DType::kF32, what + " weights");
    }
  }
}

struct GroupedCase {
  int64_t tokens, hidden, inter, experts, top_k, expert_begin, expert_end;
  bool shared;
};

std::string Describe(const GroupedCase& c) {
  return "T=" + std::to_string(c.tokens) + " H=" + std::to_string(c.hidden) +
         " I=" + std::to_string(c.inter) + " top-" + std::to_string(c.top_k) + " of " +
         std::to_string(c.experts) + " held [" + std::to_string(c.expert_begin) + ", " +
         std::to_string(c.expert_end) + ")" + (c.shared ? " +shared" : "");
}

// The inputs of one case on the host (rounded to dt) and on the device.
struct GroupedInputs {
  HostPair x, shared;
  Tensor shared_gate, ids, weights;
  std::vector<HostPair> gate, up, down;
  std::vector<testing::MoeRefExpert> ref_experts;  // the held ones, F32
  std::vector<Tensor> dev_gate, dev_up, dev_down;
};

GroupedInputs MakeInputs(kernels::Backend& g, const GroupedCase& c, DType dt, uint64_t seed) {
  GroupedInputs in;
  in.x = Random({c.tokens, c.hidden}, seed, dt);
  in.shared = Random({c.tokens, c.hidden}, seed + 1, dt);
  in.shared_gate = Random({c.tokens, 1}, seed + 2, DType::kF32).f32;
  const Tensor logits = RouterLogits(c.tokens, c.experts, seed + 3);
  in.ids = Tensor::Empty({c.tokens, c.top_k}, DType::kI32);
  in.weights = Tensor::Empty({c.tokens, c.top_k});
  TESSERA_CHECK(kernels::MoeTopK(logits, c.top_k, true, in.ids, in.weights).ok());
  const float ws = 1.0f / std::sqrt(static_cast<float>(c.hidden));
  for (int64_t e = c.expert_begin; e < c.expert_end; ++e) {
    const uint64_t s = seed + 100 + 3 * static_cast<uint64_t>(e);
    in.gate.push_back(Random({c.inter, c.hidden}, s, dt, ws));
    in.up.push_back(Random({c.inter, c.hidden}, s + 1, dt, ws));
    in.down.push_back(Random({c.hidden, c.inter}, s + 2, dt, ws));
    in.ref_experts.push_back({in.gate.back().f32, in.up.back().f32, in.down.back().f32});
    in.dev_gate.push_back(Up(g, in.gate.back().raw));
    in.dev_up.push_back(Up(g, in.up.back().raw));
    in.dev_down.push_back(Up(g, in.down.back().raw));
  }
  return in;
}

TEST_P(MoeKernels, GroupedExpertsMatchCpu) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  const std::vector<GroupedCase> cases = {
      {1, 64, 48, 8, 2, 0, 8, false},       // decode, every expert held
      {5, 64, 48, 8, 2, 2, 6, false},       // a few tokens, experts [2, 6) held (ep)
      {37, 128, 64, 6, 3, 0, 6, true},      // prefill: > 4 pairs per expert, shared expert
      {3, 40, 18, 5, 1, 1, 4, true},        // top-1; I = 18: rows off 16 bytes, the scalar loads
      {2, 36, 16, 4, 2, 0, 4, true},        // H = 36: the scalar combine in bf16 and fp16
      {2, 512, 2048, 8, 2, 0, 8, false},    // decode, blocks of several column tiles (TileIters)
      {9, 96, 36, 16, 8, 0, 16, false},     // top-8
      {3, 42, 27, 4, 2, 0, 4, false},       // H = 42, I = 27: a warp's last columns past n
      {1, 2048, 768, 16, 8, 0, 16, false},  // Qwen3-30B-A3B's expert shape at batch 1
      // Many pairs per expert: the tensor-core kernels (moe_experts_tc_cuda.cu), with
      // column tiles cut by n (96 of 64-column tiles) and slot tiles cut by each expert's count.
      {300, 256, 96, 8, 2, 0, 8, true},      // ~75 pairs per expert: 64-slot passes
      {40, 128, 64, 8, 2, 2, 6, false},      // ~10 per expert, ep: 16-slot passes
      {512, 128, 160, 16, 4, 0, 16, false},  // ~128 per expert, top-4
  };
  uint64_t seed = 1000;
  for (const GroupedCase& c : cases) {
    const GroupedInputs in = MakeInputs(g, c, dt, seed += 17);
    auto table = kernels::MakeMoeExpertTable(g, in.dev_gate, in.dev_up, in.dev_down);
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    const Tensor ids = Up(g, in.ids);
    Tensor totals = Dev(g, {c.expert_end - c.expert_begin}, DType::kI64);
    kernels::MoeRouting r;
    Status s = kernels::MoeSortByExpert(g, ids, c.expert_begin, c.expert_end, r, &totals);
    ASSERT_TRUE(s.ok()) << s.ToString();
    // The sort: every held expert's slots hold exactly its tokens.
    auto rows = g.ToHost(r.expert_rows);
    auto slot_token = g.ToHost(r.slot_token);
    auto token_slot = g.ToHost(r.token_slot);
    auto got_totals = g.ToHost(totals);
    auto active = g.ToHost(r.active);
    ASSERT_TRUE(rows.ok() && slot_token.ok() && token_slot.ok() && got_totals.ok() && active.ok());
    std::vector<int32_t> want_active;  // held experts with pairs, ascending
    for (int64_t e = c.expert_begin; e < c.expert_end; ++e) {
      std::vector<int32_t> want, got;
      for (int64_t i = 0; i < in.ids.numel(); ++i)
        if (in.ids.data<int32_t>()[i] == e) want.push_back(static_cast<int32_t>(i / c.top_k));
      const int64_t le = e - c.expert_begin;
      for (int32_t sl = rows->data<int32_t>()[le]; sl < rows->data<int32_t>()[le + 1]; ++sl)
        got.push_back(slot_token->data<int32_t>()[sl]);
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want) << Describe(c) << " expert " << e;
      EXPECT_EQ(got_totals->data<int64_t>()[le], static_cast<int64_t>(want.size()));
      if (!want.empty()) want_active.push_back(static_cast<int32_t>(le));
    }
    const int32_t* act_list = active->data<int32_t>();
    EXPECT_EQ(std::vector<int32_t>(act_list + 1, act_list + 1 + act_list[0]), want_active)
        << Describe(c) << ": the active experts";
    for (int64_t i = 0; i < in.ids.numel(); ++i) {
      const int32_t id = in.ids.data<int32_t>()[i], sl = token_slot->data<int32_t>()[i];
      if (id < c.expert_begin || id >= c.expert_end) {
        EXPECT_EQ(sl, -1) << Describe(c) << " pair " << i;
      } else {
        ASSERT_GE(sl, 0) << Describe(c) << " pair " << i;
        EXPECT_EQ(slot_token->data<int32_t>()[sl], i / c.top_k) << Describe(c) << " pair " << i;
      }
    }
    // The products and the combine.
    const int64_t slots = c.tokens * c.top_k;
    Tensor act = Dev(g, {slots, c.inter}, dt), y = Dev(g, {slots, c.hidden}, dt);
    Tensor out = Dev(g, {c.tokens, c.hidden}, dt);
    ASSERT_TRUE(kernels::MoeGroupedGateUp(Up(g, in.x.raw), *table, r, act).ok());
    ASSERT_TRUE(kernels::MoeGroupedDown(act, *table, r, y).ok());
    const Tensor shared = c.shared ? Up(g, in.shared.raw) : Tensor();
    const Tensor shared_gate = c.shared ? Up(g, in.shared_gate) : Tensor();
    s = kernels::MoeCombine(y, r, Up(g, in.weights), shared, shared_gate, out);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const std::vector<float> want = testing::MoeReference(
        in.x.f32, in.ids, in.weights, in.ref_experts, c.expert_begin,
        c.shared ? in.shared.f32 : Tensor(), c.shared ? in.shared_gate : Tensor(), dt);
    ExpectClose(Down(g, out), want, dt, "moe " + Describe(c));
    // The down product and the combine as one call (kernels/moe_down_combine.h): one launch at
    // decode sizes, the two calls otherwise; the same bits as the two calls either way.
    Tensor fused = Dev(g, {c.tokens, c.hidden}, dt);
    s = kernels::MoeDownCombine(g, act, *table, r, ids, c.expert_begin, Up(g, in.weights), shared,
                                shared_gate, fused);
    ASSERT_TRUE(s.ok()) << Describe(c) << ": " << s.ToString();
    const bool one_launch = kernels::cuda::MoeDownCombineFuses(act, *table, r);
    EXPECT_EQ(one_launch, c.tokens <= kernels::kMoeDownCombineMaxTokens && table->aligned16)
        << Describe(c);
    auto a = g.ToHost(out), b = g.ToHost(fused);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(std::memcmp(a->raw(), b->raw(), a->nbytes()), 0)
        << Describe(c) << (one_launch ? ": the one launch" : ": the two calls")
        << " differs from MoeGroupedDown + MoeCombine";
  }
}

// The grouped path (sort, gate|up, down, combine) recorded once as a CUDA
// graph, then replayed after new ids and weights are written into the same
// device buffers: no count is read on the host, so each replay routes its
// own tokens. The device token totals add up over the replays.
TEST_P(MoeKernels, GroupedExpertsReplayAsCudaGraph) {
  const DType dt = GetParam();
  kernels::Backend& g = Gpu(dt);
  const GroupedCase c{4, 64, 32, 8, 2, 0, 8, true};
  const GroupedInputs in = MakeInputs(g, c, dt, 77);
  auto table = kernels::MakeMoeExpertTable(g, in.dev_gate, in.dev_up, in.dev_down);
  ASSERT_TRUE(table.ok());
  Tensor x = Up(g, in.x.raw), shared = Up(g, in.shared.raw), shared_gate = Up(g, in.shared_gate);
  Tensor ids = Dev(g, {c.tokens, c.top_k}, DType::kI32);
  Tensor weights = Dev(g, {c.tokens, c.top_k}, DType::kF32);
  Tensor out = Dev(g, {c.tokens, c.hidden}, dt);
  Tensor totals = Dev(g, {c.experts}, DType::kI64);
  auto work = g.Capture([&]() -> Status {
    kernels::MoeRouting r;
    TESSERA_RETURN_IF_ERROR(kernels::MoeSortByExpert(g, ids, 0, c.experts, r, &totals));
    TESSERA_ASSIGN_OR_RETURN(Tensor act, g.Allocate({c.tokens * c.top_k, c.inter}, dt));
    TESSERA_ASSIGN_OR_RETURN(Tensor y, g.Allocate({c.tokens * c.top_k, c.hidden}, dt));
    TESSERA_RETURN_IF_ERROR(kernels::MoeGroupedGateUp(x, *table, r, act));
    TESSERA_RETURN_IF_ERROR(kernels::MoeGroupedDown(act, *table, r, y));
    return kernels::MoeCombine(y, r, weights, shared, shared_gate, out);
  });
  ASSERT_TRUE(work.ok()) << work.status().ToString();
  std::vector<int64_t> want_totals(static_cast<size_t>(c.experts), 0);
  for (int replay = 0; replay < 3; ++replay) {
    // Routing `replay`: every token to experts (t + replay) % 8 and (t + 3 * replay + 1) % 8.
    std::vector<int32_t> id_values;
    std::vector<float> w_values;
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int32_t a = static_cast<int32_t>((t + replay) % c.experts);
      int32_t b = static_cast<int32_t>((t + 3 * replay + 1) % c.experts);
      if (b == a) b = (b + 1) % static_cast<int32_t>(c.experts);
      id_values.insert(id_values.end(), {a, b});
      w_values.insert(w_values.end(), {0.75f, 0.25f});
      ++want_totals[static_cast<size_t>(a)];
      ++want_totals[static_cast<size_t>(b)];
    }
    ASSERT_TRUE(g.CopyFromHost(ids, id_values.data(), id_values.size() * sizeof(int32_t)).ok());
    ASSERT_TRUE(g.CopyFromHost(weights, w_values.data(), w_values.size() * sizeof(float)).ok());
    ASSERT_TRUE((*work)->Replay().ok());
    const Tensor host_ids = HostI32(id_values, {c.tokens, c.top_k});
    Tensor host_w = Tensor::Empty({c.tokens, c.top_k});
    std::copy(w_values.begin(), w_values.end(), host_w.data<float>());
    const std::vector<float> want = testing::MoeReference(
        in.x.f32, host_ids, host_w, in.ref_experts, 0, in.shared.f32, in.shared_gate, dt);
    ExpectClose(Down(g, out), want, dt, "moe graph replay " + std::to_string(replay));
  }
  auto got_totals = g.ToHost(totals);
  ASSERT_TRUE(got_totals.ok());
  for (int64_t e = 0; e < c.experts; ++e)
    EXPECT_EQ(got_totals->data<int64_t>()[e], want_totals[static_cast<size_t>(e)]) << e;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MoeKernels,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace tessera
