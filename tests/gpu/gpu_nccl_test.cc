// GPU tests (tessera_gpu_test, tests/gpu/gpu_test_util.h): NCCL collectives on device buffers, tp=2
// on two GPUs against tp=1, and a hung collective timing out.
#include "gpu/gpu_test_util.h"

namespace tessera {
namespace {

// ---------------------------------------------------------------------------
// NCCL on two GPUs (skipped with one).

template <typename F>
void OnTwoRanks(F&& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back([&, r] { body(r); });
  for (auto& t : threads) t.join();
}

std::unique_ptr<FileStore> TempStore(const std::string& tag) {
  const std::string dir =
      (fs::temp_directory_path() / ("tessera-gpu-" + tag + "-" + std::to_string(::getpid())))
          .string();
  fs::create_directories(dir);
  auto s = FileStore::Open(dir);
  TESSERA_CHECK(s.ok());
  return std::move(*s);
}

TEST(Nccl, CollectivesOnDeviceBuffers) {
  if (g_devices < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto store = TempStore("coll");
  std::vector<std::string> failures(2);
  OnTwoRanks([&](int r) {
    auto fail = [&](const std::string& m) { failures[static_cast<size_t>(r)] += m + "\n"; };
    auto backend = kernels::CreateCudaBackend(r, DType::kBF16);
    if (!backend.ok()) return fail(backend.status().ToString());
    kernels::Backend& b = **backend;
    NcclCommunicatorOptions o;
    o.group = "tp.test";
    o.rank = r;
    o.size = 2;
    o.timeout_seconds = 10;
    auto comm = CreateNcclCommunicator(*store, o, b);
    if (!comm.ok()) return fail(comm.status().ToString());
    Communicator& c = **comm;
    // bf16 all-reduce: rank r holds (r + 1) * i / 64, exact in bf16.
    const int64_t n = 4096;
    Tensor h = Tensor::Empty({n});
    for (int64_t i = 0; i < n; ++i)
      h.data<float>()[i] = static_cast<float>((r + 1) * (i % 64)) / 64.0f;
    Tensor hb = Tensor::Empty({n}, DType::kBF16);
    ConvertFromF32(DType::kBF16, h.data<float>(), hb.raw(), static_cast<size_t>(n));
    Tensor d = *b.Upload(hb);
    Status s = c.AllReduceSumTyped(d.raw(), static_cast<size_t>(n), DType::kBF16);
    if (!s.ok()) return fail(s.ToString());
    auto back = Down(b, d);
    for (int64_t i = 0; i < n; ++i)
      if (back[static_cast<size_t>(i)] != 3.0f * static_cast<float>(i % 64) / 64.0f)
        return fail("all_reduce bf16 wrong at " + std::to_string(i));
    // fp32 all-gather in place.
    Tensor g32 = *b.Zeros({2, 8}, DType::kF32);
    Tensor mine = Tensor::Empty({8});
    for (int i = 0; i < 8; ++i) mine.data<float>()[i] = static_cast<float>(r * 100 + i);
    Tensor slot = g32.Slice0(r, r + 1).Reshape({8});
    if (!b.Copy(slot, mine).ok()) return fail("copy");
    s = c.AllGatherTyped(slot.raw(), 8, DType::kF32, g32.raw());
    if (!s.ok()) return fail(s.ToString());
    auto gv = Down(b, g32);
    if (gv[3] != 3.0f || gv[8 + 3] != 103.0f) return fail("all_gather wrong");
    // Broadcast and send/recv of bytes.
    Tensor bytes = *b.Zeros({16}, DType::kU8);
    if (r == 0) {
      Tensor src = Tensor::Empty({16}, DType::kU8);
      for (int i = 0; i < 16; ++i) src.data<uint8_t>()[i] = static_cast<uint8_t>(i + 1);
      if (!b.Copy(bytes, src).ok()) return fail("copy");
    }
    s = c.Broadcast(bytes.raw(), 16, 0);
    if (!s.ok()) return fail(s.ToString());
    Tensor bh = *b.ToHost(bytes);
    if (bh.data<uint8_t>()[15] != 16) return fail("broadcast wrong");
    s = r == 0 ? c.Send(bytes.raw(), 16, 1) : c.Recv(bytes.raw(), 16, 0);
    if (!s.ok()) return fail(s.ToString());
    s = c.Barrier();
    if (!s.ok()) return fail(s.ToString());
    // Latency of the decode-size all-reduce (batch 1 hidden 4096 bf16 = 8 KiB).
    Tensor ar = *b.Zeros({4096}, DType::kBF16);
    for (int i = 0; i < 20; ++i) (void)c.AllReduceSumTyped(ar.raw(), 4096, DType::kBF16);
    (void)b.Synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const int iters = 200;
    for (int i = 0; i < iters; ++i) (void)c.AllReduceSumTyped(ar.raw(), 4096, DType::kBF16);
    const auto t1 = std::chrono::steady_clock::now();
    (void)b.Synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(t2 - t0).count() / iters;
    const double enq = std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
    if (r == 0)
      std::printf(
          "  nccl all-reduce 8 KiB bf16, 2 GPUs, back to back on the stream: %.1f us per call "
          "(host enqueue %.1f us per call)\n",
          us, enq);
  });
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

// tp = 2 on the fixtures: logits and greedy tokens equal tp = 1 on the GPU.
// The mixtures of experts run twice: experts split inside each expert, and
// whole experts per rank (expert parallelism: each rank computes its own
// experts only and the all-reduce sums them).
TEST(Nccl, TensorParallelFixturesMatchTp1) {
  if (g_devices < 2) GTEST_SKIP() << "needs 2 GPUs";
  std::vector<std::pair<std::string, bool>> runs;  // (fixture, expert_parallel)
  for (const std::string& name : FixtureNames()) {
    runs.emplace_back(name, false);
    auto config = LoadModelConfig(g_fixtures + "/models/" + name);
    if (config.ok() && config->is_moe()) runs.emplace_back(name, true);
  }
  for (const auto& [name, ep] : runs) {
    const std::string dir = g_fixtures + "/models/" + name;
    const json ref = json::parse(ReadFile(dir + "/reference.json"));
    auto config = LoadModelConfig(dir);
    ASSERT_TRUE(config.ok());
    auto par = ParallelConfig::Make(*config, 2, 1, {}, ep);
    if (!par.ok()) {
      std::printf("  %s: tp=2 not possible (%s)\n", name.c_str(), par.status().message().c_str());
      continue;
    }
    std::vector<std::vector<int32_t>> prompts;
    for (const json& p : ref["prompts"]) prompts.push_back(p["ids"].get<std::vector<int32_t>>());
    auto tp1 = testing::LocalModel::Load(dir, 256, 16, &Gpu(DType::kF32));
    ASSERT_TRUE(tp1.ok());
    auto want_tokens = (*tp1)->Greedy(prompts, 16);
    ASSERT_TRUE(want_tokens.ok());
    auto want_logits = (*tp1)->LastLogits(prompts[0]);
    ASSERT_TRUE(want_logits.ok());
    auto store = TempStore(name + (ep ? "-ep" : ""));
    std::vector<std::string> failures(2);
    std::vector<std::vector<std::vector<int32_t>>> tokens(2);
    std::vector<std::vector<float>> logits(2);
    OnTwoRanks([&](int r) {
      auto fail = [&](const std::string& m) { failures[static_cast<size_t>(r)] += m + "\n"; };
      auto backend = kernels::CreateCudaBackend(r, DType::kF32);
      if (!backend.ok()) return fail(backend.status().ToString());
      NcclCommunicatorOptions o;
      o.group = "tp." + name + (ep ? ".ep" : "");
      o.rank = r;
      o.size = 2;
      o.timeout_seconds = 20;
      auto comm = CreateNcclCommunicator(*store, o, **backend);
      if (!comm.ok()) return fail(comm.status().ToString());
      auto loaded = LoadModel(dir, *par, r, comm->get(), {}, backend->get());
      if (!loaded.ok()) return fail(loaded.status().ToString());
      const StageLayout lay = loaded->model->layout();
      auto cache = KvCache::Create(**backend, lay.num_layers(), 256, 16, lay.kv_heads_local,
                                   config->head_dim);
      if (!cache.ok()) return fail(cache.status().ToString());
      PipelineLinks links;
      links.tp_rank = r;
      links.tp = comm->get();
      {
        PipelineExecutor exec(
            loaded->model.get(), cache->get(), links, [&](const StepBatch& b, const Tensor& l) {
              if (logits[static_cast<size_t>(r)].empty() && b.seqs.size() == prompts.size() &&
                  b.seqs[0].num_tokens == static_cast<int32_t>(prompts[0].size()))
                logits[static_cast<size_t>(r)].assign(l.data<float>(), l.data<float>() + l.dim(1));
            });
        BlockAllocator alloc(256);
        Engine engine(*config, &exec, &alloc, 16, nullptr);
        std::vector<GenerationRequest> reqs;
        for (const auto& p : prompts) {
          GenerationRequest q;
          q.prompt_ids = p;
          q.max_tokens = 16;
          q.ignore_eos = true;
          reqs.push_back(q);
        }
        auto results = engine.Generate(reqs);
        if (!results.ok()) return fail(results.status().ToString());
        for (const auto& res : *results) tokens[static_cast<size_t>(r)].push_back(res.tokens);
      }
    });
    ASSERT_EQ(failures[0], "") << name << (ep ? " (expert parallel)" : "");
    ASSERT_EQ(failures[1], "") << name << (ep ? " (expert parallel)" : "");
    EXPECT_EQ(tokens[0], *want_tokens) << name << (ep ? " ep" : "") << ": tp=2 greedy != tp=1";
    EXPECT_EQ(tokens[1], *want_tokens) << name << ": tp rank 1 disagrees";
    ASSERT_EQ(logits[0].size(), want_logits->size());
    const double d = RelMaxDiff(logits[0], json(*want_logits));
    std::printf("  %-24s tp=2%s vs tp=1 (F32, GPU): first-prompt logits rel diff %.3g, greedy %s\n",
                name.c_str(), ep ? " ep" : "", d,
                tokens[0] == *want_tokens ? "equal" : "DIFFERENT");
    EXPECT_LE(d, 1e-4) << name << (ep ? " ep" : "");
  }
}

TEST(Nccl, HungCollectiveTimesOutAndNamesRankAndGroup) {
  if (g_devices < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto store = TempStore("hang");
  std::vector<Status> results(2);
  OnTwoRanks([&](int r) {
    auto backend = kernels::CreateCudaBackend(r, DType::kF32);
    if (!backend.ok()) return;
    NcclCommunicatorOptions o;
    o.group = "tp.hang";
    o.rank = r;
    o.size = 2;
    o.timeout_seconds = 3;
    o.blocking = true;
    auto comm = CreateNcclCommunicator(*store, o, **backend);
    if (!comm.ok()) {
      results[static_cast<size_t>(r)] = comm.status();
      return;
    }
    Tensor d = *(*backend)->Zeros({1024}, DType::kF32);
    if (r == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      results[0] = (*comm)->AllReduceSum(d.data<float>(), 1024);  // rank 1 never joins
      std::printf("  hung all-reduce returned after %.1f s: %s\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  results[0].ToString().c_str());
      Status again = (*comm)->AllReduceSum(d.data<float>(), 1024);
      std::printf("  next call: %s\n", again.ToString().c_str());
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(6));
    }
  });
  EXPECT_EQ(results[0].code(), StatusCode::kDeadlineExceeded) << results[0].ToString();
  EXPECT_NE(results[0].message().find("rank 0 of group tp.hang"), std::string::npos)
      << results[0].ToString();
}

}  // namespace
}  // namespace tessera
