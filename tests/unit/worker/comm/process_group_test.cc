// ProcessGroup wiring across real processes: tp groups per stage and pipe
// links between the same tp rank of consecutive stages, and with a different
// tp per stage, the stage_handoff pairing of pipe and return links.
#include "worker/comm/process_group.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/model/parallel_rank.h"
#include "common/model/stage_handoff.h"
#include "common/net/tcp_store.h"
#include "support/multi_process.h"
#include "support/store_process.h"

namespace tessera {
namespace {

TEST(ParallelRank, WorldRankRoundTrips) {
  // pp outermost, then tp: tp=2, pp=2 -> (0,0)=0 (0,1)=1 (1,0)=2 (1,1)=3.
  EXPECT_EQ(WorldRank(1, 0, 2), 2);
  EXPECT_EQ(WorldRank(1, 1, 2), 3);
  for (int tp : {1, 2, 3}) {
    for (int w = 0; w < 4 * tp; ++w) EXPECT_EQ(WorldRank(StageOf(w, tp), TpRankOf(w, tp), tp), w);
  }
}

// The store runs in a process of its own so that RunRanks forks a
// single-threaded test process (see store_process.h).
std::unique_ptr<testing::StoreProcess> StartServer() {
  auto server = testing::StoreProcess::Start();
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return std::move(server).value();
}

StatusOr<std::unique_ptr<ProcessGroup>> Build(Store& store, int tp, int pp, int world_rank) {
  ProcessGroupOptions opts;
  opts.tp = tp;
  opts.pp = pp;
  opts.world_rank = world_rank;
  opts.timeout_seconds = 5.0;
  opts.connect_timeout_seconds = 5.0;
  return ProcessGroup::Create(store, opts);
}

TEST(ProcessGroup, Tp2Pp2Wiring) {
  auto server = StartServer();
  const int port = server->port();
  constexpr int kTp = 2, kPp = 2;
  auto outcomes = testing::RunRanks(kTp * kPp, [&](int world_rank) -> std::string {
    auto store = TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials());
    RANK_CHECK_OK(store.status());
    auto pg_or = Build(**store, kTp, kPp, world_rank);
    RANK_CHECK_OK(pg_or.status());
    ProcessGroup& pg = **pg_or;
    const int stage = world_rank / kTp, tp_rank = world_rank % kTp;
    RANK_CHECK(pg.stage() == stage && pg.tp_rank() == tp_rank);
    RANK_CHECK(pg.world_size() == 4);

    // The tp group holds exactly this stage's ranks: the sum of
    // (world_rank + 1) is 1+2 = 3 on stage 0 and 3+4 = 7 on stage 1.
    RANK_CHECK(pg.tp() != nullptr);
    RANK_CHECK(pg.tp()->name() == fmt::format("tp.stage{}", stage));
    RANK_CHECK(pg.tp()->size() == kTp && pg.tp()->rank() == tp_rank);
    float x = world_rank + 1.0f;
    RANK_CHECK_OK(pg.tp()->AllReduceSum(&x, 1));
    RANK_CHECK_MSG(x == (stage == 0 ? 3.0f : 7.0f), fmt::format("x = {}", x));

    // Pipe links: null at the ends, named after the stage pair and tp rank.
    RANK_CHECK((pg.prev_stage() == nullptr) == (stage == 0));
    RANK_CHECK(pg.next_stage_links().size() == (stage == kPp - 1 ? 0u : 1u));
    const std::string pipe = fmt::format("pipe.stage0-1.tp{}", tp_rank);
    Communicator* link = stage == 0 ? pg.next_stage_links()[0] : pg.prev_stage();
    RANK_CHECK(link->name() == pipe && link->size() == 2);
    RANK_CHECK(link->rank() ==
               (stage == 0 ? ProcessGroup::kPipeEarlierRank : ProcessGroup::kPipeLaterRank));

    // Each tp rank of stage 0 forwards its own copy of the hidden state to
    // the same tp rank of stage 1, which checks who sent it, then answers.
    constexpr size_t kHidden = 4096;
    std::vector<float> hidden(kHidden);
    if (stage == 0) {
      for (size_t i = 0; i < kHidden; ++i) hidden[i] = 1000.0f * world_rank + i;
      RANK_CHECK_OK(pg.SendToNextStage(hidden.data(), hidden.size() * sizeof(float)));
      float reply = 0;
      RANK_CHECK_OK(
          pg.next_stage_links()[0]->Recv(&reply, sizeof(reply), ProcessGroup::kPipeLaterRank));
      RANK_CHECK(reply == static_cast<float>(WorldRank(1, tp_rank, kTp)));
      RANK_CHECK(pg.RecvFromPrevStage(&reply, sizeof(reply)).code() ==
                 StatusCode::kFailedPrecondition);
    } else {
      RANK_CHECK_OK(pg.RecvFromPrevStage(hidden.data(), hidden.size() * sizeof(float)));
      const int sender = WorldRank(0, tp_rank, kTp);
      for (size_t i = 0; i < kHidden; ++i) RANK_CHECK(hidden[i] == 1000.0f * sender + i);
      float reply = static_cast<float>(world_rank);
      RANK_CHECK_OK(pg.prev_stage()->Send(&reply, sizeof(reply), ProcessGroup::kPipeEarlierRank));
      RANK_CHECK(pg.SendToNextStage(&reply, sizeof(reply)).code() ==
                 StatusCode::kFailedPrecondition);
    }
    return "";
  });
  for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << testing::Describe(o);
}

// Three stages, one rank each: the middle stage has both links and relays.
TEST(ProcessGroup, Pp3ChainRelaysThroughTheMiddleStage) {
  auto server = StartServer();
  const int port = server->port();
  auto outcomes = testing::RunRanks(3, [&](int world_rank) -> std::string {
    auto store = TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials());
    RANK_CHECK_OK(store.status());
    auto pg_or = Build(**store, 1, 3, world_rank);
    RANK_CHECK_OK(pg_or.status());
    ProcessGroup& pg = **pg_or;
    RANK_CHECK(pg.tp()->size() == 1);
    float x[2] = {0, 0};
    if (pg.is_first_stage()) {
      x[0] = 1.0f;
      x[1] = 2.0f;
    } else {
      RANK_CHECK_OK(pg.RecvFromPrevStage(x, sizeof(x)));
      x[0] += 10.0f * world_rank;
    }
    RANK_CHECK_OK(pg.tp()->AllReduceSum(x, 2));  // a no-op with tp = 1
    if (!pg.is_last_stage()) {
      RANK_CHECK_OK(pg.SendToNextStage(x, sizeof(x)));
    } else {
      RANK_CHECK_MSG(x[0] == 31.0f && x[1] == 2.0f, fmt::format("x = {} {}", x[0], x[1]));
    }
    return "";
  });
  for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << testing::Describe(o);
}

StatusOr<std::unique_ptr<ProcessGroup>> BuildPerStage(Store& store, std::vector<int> tps,
                                                      int world_rank) {
  ProcessGroupOptions opts;
  opts.tp = 0;  // ignored with tp_per_stage
  opts.pp = static_cast<int>(tps.size());
  opts.tp_per_stage = std::move(tps);
  opts.world_rank = world_rank;
  opts.timeout_seconds = 5.0;
  opts.connect_timeout_seconds = 5.0;
  return ProcessGroup::Create(store, opts);
}

// Stages of different tp, as real processes: every rank checks its tp group,
// that it hears the hidden state from the sender stage_handoff pairs it with
// (each sender stamps its world rank into the payload), that it sends to
// exactly its receivers, and that the last stage's return links reach every
// stage-0 rank once.
void RunPerStage(const std::vector<int>& tps) {
  auto server = StartServer();
  const int port = server->port();
  const int pp = static_cast<int>(tps.size());
  int world = 0;
  for (int t : tps) world += t;
  auto outcomes = testing::RunRanks(world, [&](int world_rank) -> std::string {
    auto store = TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials());
    RANK_CHECK_OK(store.status());
    auto pg_or = BuildPerStage(**store, tps, world_rank);
    RANK_CHECK_OK(pg_or.status());
    ProcessGroup& pg = **pg_or;
    const int stage = StageOf(world_rank, tps), tp_rank = TpRankOf(world_rank, tps);
    const int tp = tps[static_cast<size_t>(stage)];
    RANK_CHECK(pg.stage() == stage && pg.tp_rank() == tp_rank);
    RANK_CHECK(pg.world_size() == world && pg.tp_size() == tp && pg.tp_per_stage() == tps);

    // The tp group is this stage's ranks: sum of (world_rank + 1) over them.
    RANK_CHECK(pg.tp()->name() == fmt::format("tp.stage{}", stage));
    RANK_CHECK(pg.tp()->size() == tp && pg.tp()->rank() == tp_rank);
    float x = world_rank + 1.0f;
    RANK_CHECK_OK(pg.tp()->AllReduceSum(&x, 1));
    float want = 0;
    for (int t = 0; t < tp; ++t) want += WorldRank(stage, t, tps) + 1.0f;
    RANK_CHECK_MSG(x == want, fmt::format("x = {}, want {}", x, want));

    // Links follow stage_handoff.
    const std::vector<int> receivers =
        stage == pp - 1 ? std::vector<int>{}
                        : HandoffReceivers(tp_rank, tp, tps[static_cast<size_t>(stage + 1)]);
    RANK_CHECK(pg.next_stage_receivers() == receivers);
    RANK_CHECK(pg.next_stage_links().size() == receivers.size());
    for (size_t k = 0; k < receivers.size(); ++k) {
      const std::string name =
          receivers[k] == tp_rank
              ? fmt::format("pipe.stage{}-{}.tp{}", stage, stage + 1, tp_rank)
              : fmt::format("pipe.stage{}-{}.tp{}-{}", stage, stage + 1, tp_rank, receivers[k]);
      RANK_CHECK_MSG(pg.next_stage_links()[k]->name() == name, pg.next_stage_links()[k]->name());
      RANK_CHECK(pg.next_stage_links()[k]->rank() == ProcessGroup::kPipeEarlierRank);
    }
    RANK_CHECK((pg.prev_stage() == nullptr) == (stage == 0));

    // The hidden state flows stage by stage; each rank forwards a payload
    // stamped with its own world rank.
    constexpr size_t kHidden = 1024;
    std::vector<float> hidden(kHidden);
    if (stage > 0) {
      RANK_CHECK_OK(pg.RecvFromPrevStage(hidden.data(), hidden.size() * sizeof(float)));
      const int sender = WorldRank(
          stage - 1, HandoffSender(tp_rank, tps[static_cast<size_t>(stage - 1)], tp), tps);
      for (size_t i = 0; i < kHidden; ++i)
        RANK_CHECK_MSG(hidden[i] == 1000.0f * sender + i,
                       fmt::format("hidden[{}] = {} from the wrong sender (want world rank {})", i,
                                   hidden[i], sender));
    }
    if (stage < pp - 1) {
      for (size_t i = 0; i < kHidden; ++i) hidden[i] = 1000.0f * world_rank + i;
      RANK_CHECK_OK(pg.SendToNextStage(hidden.data(), hidden.size() * sizeof(float)));
    } else {
      RANK_CHECK(pg.SendToNextStage(hidden.data(), 4).code() == StatusCode::kFailedPrecondition);
    }

    // Return links: last stage -> stage 0, with the same pairing.
    const std::vector<Communicator*> ret = pg.return_links();
    if (stage == 0) {
      RANK_CHECK(ret.size() == 1);
      RANK_CHECK(ret[0]->rank() == ProcessGroup::kReturnFirstRank);
      float from = -1;
      RANK_CHECK_OK(ret[0]->Recv(&from, sizeof(from), ProcessGroup::kReturnLastRank));
      const int sender = WorldRank(pp - 1, HandoffSender(tp_rank, tps.back(), tps[0]), tps);
      RANK_CHECK_MSG(from == static_cast<float>(sender),
                     fmt::format("tokens from world rank {}, want {}", from, sender));
    } else if (stage == pp - 1) {
      RANK_CHECK(ret.size() == HandoffReceivers(tp_rank, tp, tps[0]).size());
      const float me = static_cast<float>(world_rank);
      for (Communicator* c : ret) {
        RANK_CHECK(c->rank() == ProcessGroup::kReturnLastRank);
        RANK_CHECK_OK(c->Send(&me, sizeof(me), ProcessGroup::kReturnFirstRank));
      }
    } else {
      RANK_CHECK(ret.empty());
    }
    return "";
  });
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(world));
  for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << testing::Describe(o);
}

// Growing tp: one sender feeds several receivers; the return fans in.
TEST(ProcessGroup, PerStageTpGrowing_1_2_3) { RunPerStage({1, 2, 3}); }

// Shrinking tp: senders 1 and 2 of stage 0 feed nobody; the single last-stage
// rank returns tokens to all three stage-0 ranks.
TEST(ProcessGroup, PerStageTpShrinking_3_1) { RunPerStage({3, 1}); }

TEST(ProcessGroup, PerStageTpMixed_2_4_1) { RunPerStage({2, 4, 1}); }

TEST(ProcessGroup, RejectsBadPerStageOptions) {
  auto server = StartServer();
  auto store = TcpStore::Connect("127.0.0.1", server->port(), 5.0, testing::TestStoreCredentials());
  ASSERT_TRUE(store.ok());
  ProcessGroupOptions opts;
  opts.pp = 2;
  opts.tp_per_stage = {2, 1, 1};
  EXPECT_EQ(ProcessGroup::Create(**store, opts).status().message(),
            "process group: tp_per_stage=[2, 1, 1] has 3 entries but pp=2");
  opts.tp_per_stage = {2, 0};
  EXPECT_EQ(ProcessGroup::Create(**store, opts).status().message(),
            "process group: stage 1 has tp=0, must be >= 1");
  opts.tp_per_stage = {2, 1};
  opts.world_rank = 3;
  EXPECT_EQ(ProcessGroup::Create(**store, opts).status().message(),
            "process group: world rank 3 is outside [0, 3) for tp=[2, 1] pp=2");
}

TEST(ProcessGroup, RejectsARankOutsideTheGrid) {
  auto server = StartServer();
  auto store = TcpStore::Connect("127.0.0.1", server->port(), 5.0, testing::TestStoreCredentials());
  ASSERT_TRUE(store.ok());
  auto pg = Build(**store, 2, 2, 4);
  EXPECT_EQ(pg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pg.status().message().find("world rank 4"), std::string::npos)
      << pg.status().ToString();
  EXPECT_EQ(Build(**store, 0, 2, 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
