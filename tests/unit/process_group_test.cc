// ProcessGroup wiring across real processes: tp groups per stage and pipe
// links between the same tp rank of consecutive stages.
#include "worker/process_group.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/parallel_rank.h"
#include "common/tcp_store.h"
#include "multi_process.h"

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

std::unique_ptr<TcpStoreServer> StartServer() {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
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
    auto store = TcpStore::Connect("127.0.0.1", port, 5.0);
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
    RANK_CHECK((pg.next_stage() == nullptr) == (stage == kPp - 1));
    const std::string pipe = fmt::format("pipe.stage0-1.tp{}", tp_rank);
    Communicator* link = stage == 0 ? pg.next_stage() : pg.prev_stage();
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
      RANK_CHECK_OK(pg.next_stage()->Recv(&reply, sizeof(reply), ProcessGroup::kPipeLaterRank));
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
    auto store = TcpStore::Connect("127.0.0.1", port, 5.0);
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

TEST(ProcessGroup, RejectsARankOutsideTheGrid) {
  auto server = StartServer();
  auto store = TcpStore::Connect("127.0.0.1", server->port(), 5.0);
  ASSERT_TRUE(store.ok());
  auto pg = Build(**store, 2, 2, 4);
  EXPECT_EQ(pg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pg.status().message().find("world rank 4"), std::string::npos)
      << pg.status().ToString();
  EXPECT_EQ(Build(**store, 0, 2, 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
