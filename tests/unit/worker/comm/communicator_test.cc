// GlooCommunicator across real processes: each rank is a fork()ed child that
// rendezvouses through a TcpStore served by the test process (or a FileStore)
// and talks to the others over loopback TCP.
#include "worker/comm/communicator.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>

#include "common/net/file_store.h"
#include "common/net/tcp_store.h"
#include "kernels/backend.h"
#include "support/multi_process.h"
#include "support/store_process.h"
#include "support/test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/exec/rank_inputs.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs in a child: connects to the parent's store and joins `group`.
StatusOr<std::unique_ptr<GlooCommunicator>> Join(int port, const std::string& group, int rank,
                                                 int size, double timeout_seconds = 5.0,
                                                 std::unique_ptr<TcpStore>* keep_store = nullptr) {
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<TcpStore> store,
      TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials()));
  GlooCommunicatorOptions opts;
  opts.group = group;
  opts.rank = rank;
  opts.size = size;
  opts.timeout_seconds = timeout_seconds;
  opts.connect_timeout_seconds = 5.0;
  auto comm = GlooCommunicator::Create(*store, opts);
  if (keep_store) *keep_store = std::move(store);
  return comm;
}

class CommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::StoreProcess::Start();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    group_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  int port() const { return server_->port(); }

  static void ExpectAllSucceeded(const std::vector<testing::RankOutcome>& outcomes) {
    for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << testing::Describe(o);
  }

  std::unique_ptr<testing::StoreProcess> server_;  // a process: RunRanks forks
  std::string group_;
};

// Input of `rank` for the all-reduce test: pseudo-random floats that any
// rank can regenerate, so each rank computes the exact expected sum.
std::vector<float> RandomInput(int rank, size_t count) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) x = dist(gen);
  return v;
}

TEST_F(CommunicatorTest, AllReduceSumMatchesRankOrderSumOnEveryRank) {
  for (int n : {2, 3, 4}) {
    const int p = port();
    const std::string group = group_ + ".n" + std::to_string(n);
    auto outcomes = testing::RunRanks(n, [&](int rank) -> std::string {
      auto comm = Join(p, group, rank, n);
      RANK_CHECK_OK(comm.status());
      RANK_CHECK((*comm)->rank() == rank && (*comm)->size() == n);
      // Counts smaller than, equal to and not divisible by the group size,
      // and one large enough to span many socket buffers.
      for (size_t count :
           {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{1000}, size_t{300001}}) {
        std::vector<float> data = RandomInput(rank, count);
        RANK_CHECK_OK((*comm)->AllReduceSum(data.data(), count));
        std::vector<float> expected = RandomInput(0, count);
        for (int r = 1; r < n; ++r) {
          std::vector<float> in = RandomInput(r, count);
          for (size_t i = 0; i < count; ++i) expected[i] += in[i];
        }
        // Bitwise: the sum is taken once, in rank order, and shared.
        // (count 0: empty vectors have no data pointer, which memcmp may not get.)
        RANK_CHECK_MSG(
            count == 0 || std::memcmp(data.data(), expected.data(), count * sizeof(float)) == 0,
            fmt::format("count {}", count));
      }
      return "";
    });
    ExpectAllSucceeded(outcomes);
  }
}

TEST_F(CommunicatorTest, AllGatherBroadcastAndBarrier) {
  constexpr int kRanks = 3;
  const int p = port();
  const std::string group = group_;
  auto outcomes = testing::RunRanks(kRanks, [&](int rank) -> std::string {
    auto comm = Join(p, group, rank, kRanks);
    RANK_CHECK_OK(comm.status());
    Communicator& c = **comm;

    // all_gather: recv[r, i] = 100 * r + i.
    constexpr size_t kPer = 5;
    std::vector<float> send(kPer);
    for (size_t i = 0; i < kPer; ++i) send[i] = 100.0f * rank + i;
    std::vector<float> recv(kRanks * kPer, -1.0f);
    RANK_CHECK_OK(c.AllGather(send.data(), kPer, recv.data()));
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < kPer; ++i) RANK_CHECK(recv[r * kPer + i] == 100.0f * r + i);
    }
    // In place: the send slice is this rank's slot of recv.
    std::vector<float> inplace(kRanks * kPer, 0.0f);
    for (size_t i = 0; i < kPer; ++i) inplace[rank * kPer + i] = -1.0f * rank - i;
    RANK_CHECK_OK(c.AllGather(inplace.data() + rank * kPer, kPer, inplace.data()));
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < kPer; ++i) RANK_CHECK(inplace[r * kPer + i] == -1.0f * r - i);
    }

    // broadcast from every root, 1 MiB each.
    for (int root = 0; root < kRanks; ++root) {
      std::vector<uint8_t> buf(1 << 20, 0);
      if (rank == root) {
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7 + root);
      }
      RANK_CHECK_OK(c.Broadcast(buf.data(), buf.size(), root));
      for (size_t i = 0; i < buf.size(); i += 4099) {
        RANK_CHECK(buf[i] == static_cast<uint8_t>(i * 7 + root));
      }
    }

    // barrier: nobody leaves before the last rank (which arrives late) enters.
    if (rank == kRanks - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto start = Clock::now();
    RANK_CHECK_OK(c.Barrier());
    if (rank != kRanks - 1) RANK_CHECK(SecondsSince(start) > 0.2);
    return "";
  });
  ExpectAllSucceeded(outcomes);
}

TEST_F(CommunicatorTest, SendRecvInOrderBetweenPairs) {
  constexpr int kRanks = 4;
  const int p = port();
  const std::string group = group_;
  auto outcomes = testing::RunRanks(kRanks, [&](int rank) -> std::string {
    auto comm = Join(p, group, rank, kRanks);
    RANK_CHECK_OK(comm.status());
    Communicator& c = **comm;
    // A ring: rank r sends to r+1 and receives from r-1. Send can wait for
    // the peer's Recv, so even ranks send first and odd ranks receive first.
    const int next = (rank + 1) % kRanks;
    const int prev = (rank + kRanks - 1) % kRanks;
    // Three messages per link, of different sizes (one of 8 MiB, one empty),
    // must arrive in order.
    const std::vector<size_t> sizes = {64, 8 << 20, 0};
    auto fill = [](int from, size_t k, size_t n) {
      std::vector<uint8_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(from * 31 + k * 7 + i);
      return v;
    };
    auto send_all = [&]() -> Status {
      for (size_t k = 0; k < sizes.size(); ++k) {
        auto v = fill(rank, k, sizes[k]);
        TESSERA_RETURN_IF_ERROR(c.Send(v.data(), v.size(), next));
      }
      return Status::Ok();
    };
    auto recv_all = [&]() -> Status {
      for (size_t k = 0; k < sizes.size(); ++k) {
        std::vector<uint8_t> v(sizes[k], 0xAB);
        TESSERA_RETURN_IF_ERROR(c.Recv(v.data(), v.size(), prev));
        if (v != fill(prev, k, sizes[k])) {
          return Internal(fmt::format("message {} from rank {} is corrupt", k, prev));
        }
      }
      return Status::Ok();
    };
    if (rank % 2 == 0) {
      RANK_CHECK_OK(send_all());
      RANK_CHECK_OK(recv_all());
    } else {
      RANK_CHECK_OK(recv_all());
      RANK_CHECK_OK(send_all());
    }
    // Point-to-point traffic does not disturb collectives that follow.
    float x = 1.0f + rank;
    RANK_CHECK_OK(c.AllReduceSum(&x, 1));
    RANK_CHECK(x == 10.0f);
    return "";
  });
  ExpectAllSucceeded(outcomes);
}

TEST_F(CommunicatorTest, RecvOfTheWrongSizeIsRejected) {
  const int p = port();
  const std::string group = group_;
  auto outcomes = testing::RunRanks(2, [&](int rank) -> std::string {
    auto comm = Join(p, group, rank, 2, /*timeout_seconds=*/3.0);
    RANK_CHECK_OK(comm.status());
    std::vector<uint8_t> buf(32, 1);
    auto start = Clock::now();
    if (rank == 0) {
      Status s = (*comm)->Send(buf.data(), 16, 1);
      std::fprintf(stderr, "rank 0: %s\n", s.ToString().c_str());
      // The receiver refuses the payload and drops the connection.
      RANK_CHECK_MSG(!s.ok(), "send of a rejected payload succeeded");
      RANK_CHECK_MSG(SecondsSince(start) < 3.5, s.ToString());
      return "";
    }
    Status s = (*comm)->Recv(buf.data(), 32, 0);
    std::fprintf(stderr, "rank 1: %s\n", s.ToString().c_str());
    RANK_CHECK(s.code() == StatusCode::kInvalidArgument);
    RANK_CHECK_MSG(s.message() ==
                       "recv on rank 1 of group RecvOfTheWrongSizeIsRejected: rank 0 sent 16 "
                       "bytes, the receive expects 32 bytes",
                   s.ToString());
    // The communicator is broken from now on.
    Status again = (*comm)->Barrier();
    RANK_CHECK(again.code() == StatusCode::kFailedPrecondition);
    RANK_CHECK_MSG(again.message().find("rank 0 sent 16 bytes") != std::string::npos,
                   again.ToString());
    return "";
  });
  ExpectAllSucceeded(outcomes);
}

// A rank is SIGKILLed while the others are inside all_reduce: they must
// return an error naming it well within the timeout, and exit cleanly.
TEST_F(CommunicatorTest, KilledRankIsNamedByEveryOtherRank) {
  constexpr int kRanks = 3;
  constexpr double kTimeout = 3.0;
  const int p = port();
  const std::string group = group_;
  auto outcomes = testing::RunRanks(kRanks, [&](int rank) -> std::string {
    auto comm = Join(p, group, rank, kRanks, kTimeout);
    RANK_CHECK_OK(comm.status());
    std::vector<float> data(100000, 1.0f);
    RANK_CHECK_OK((*comm)->AllReduceSum(data.data(), data.size()));
    RANK_CHECK(data[0] == 3.0f);
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }
    auto start = Clock::now();
    Status s = (*comm)->AllReduceSum(data.data(), data.size());
    double took = SecondsSince(start);
    std::fprintf(stderr, "rank %d after %.2f s: %s\n", rank, took, s.ToString().c_str());
    RANK_CHECK_MSG(!s.ok(), "all_reduce succeeded without rank 2");
    RANK_CHECK_MSG(took < kTimeout + 1.0, s.ToString());
    RANK_CHECK_MSG(
        s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded,
        s.ToString());
    const std::string where =
        fmt::format("all_reduce on rank {} of group KilledRankIsNamedByEveryOtherRank: ", rank);
    RANK_CHECK_MSG(s.message().rfind(where, 0) == 0, s.ToString());
    RANK_CHECK_MSG(s.message().find("rank 2") != std::string::npos, s.ToString());
    // Later calls fail at once instead of touching the dead connections.
    start = Clock::now();
    Status again = (*comm)->Barrier();
    RANK_CHECK(again.code() == StatusCode::kFailedPrecondition);
    RANK_CHECK(SecondsSince(start) < 0.5);
    return "";
  });
  EXPECT_EQ(outcomes[2].signal, SIGKILL) << testing::Describe(outcomes[2]);
  EXPECT_FALSE(outcomes[2].killed_at_deadline);
  for (int r : {0, 1}) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << testing::Describe(outcomes[r]);
    EXPECT_LT(outcomes[r].seconds, 10.0) << testing::Describe(outcomes[r]);
  }
}

// A rank stays alive but never enters the collective: the others time out
// after the configured timeout and name it.
TEST_F(CommunicatorTest, SilentRankTimesOutNamingIt) {
  constexpr int kRanks = 3;
  constexpr double kTimeout = 2.0;
  const int p = port();
  const std::string group = group_;
  auto outcomes = testing::RunRanks(kRanks, [&](int rank) -> std::string {
    auto comm = Join(p, group, rank, kRanks, kTimeout);
    RANK_CHECK_OK(comm.status());
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3000));
      return "";
    }
    std::vector<float> data(1000, 1.0f);
    auto start = Clock::now();
    Status s = (*comm)->AllReduceSum(data.data(), data.size());
    double took = SecondsSince(start);
    std::fprintf(stderr, "rank %d after %.2f s: %s\n", rank, took, s.ToString().c_str());
    RANK_CHECK(s.code() == StatusCode::kDeadlineExceeded);
    RANK_CHECK_MSG(took >= kTimeout - 0.05 && took < kTimeout + 1.0, s.ToString());
    RANK_CHECK_MSG(s.message() == fmt::format("all_reduce on rank {} of group "
                                              "SilentRankTimesOutNamingIt: timed out after 2.0 s "
                                              "waiting for rank 2",
                                              rank),
                   s.ToString());
    return "";
  });
  ExpectAllSucceeded(outcomes);
}

// Interrupt from another thread wakes a receive that waits on a peer that
// will never send (the worker's plan ended), long before the timeout, and
// fails every later call of the communicator.
TEST_F(CommunicatorTest, InterruptWakesABlockedReceive) {
  constexpr double kTimeout = 20.0;
  const int p = port();
  const std::string group = group_;
  auto outcomes = testing::RunRanks(2, [&](int rank) -> std::string {
    auto comm = Join(p, group, rank, 2, kTimeout);
    RANK_CHECK_OK(comm.status());
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // never sends
      return "";
    }
    GlooCommunicator* c = comm->get();
    std::thread interrupter([c] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c->Interrupt("plan 3 ended");
    });
    std::vector<uint8_t> buf(64);
    const auto start = Clock::now();
    Status s = c->Recv(buf.data(), buf.size(), 1);
    const double took = SecondsSince(start);
    interrupter.join();
    RANK_CHECK_MSG(s.code() == StatusCode::kUnavailable, s.ToString());
    RANK_CHECK_MSG(s.message().find("interrupted: plan 3 ended") != std::string::npos,
                   s.ToString());
    RANK_CHECK_MSG(took >= 0.15 && took < 2.0, std::to_string(took) + " s: " + s.ToString());
    Status later = c->Send(buf.data(), buf.size(), 1);
    RANK_CHECK_MSG(!later.ok() && later.message().find("plan 3 ended") != std::string::npos,
                   later.ToString());
    return "";
  });
  ExpectAllSucceeded(outcomes);
}

// A rank that never joins: the others' Create fails within the connect
// timeout, naming the store key of the missing rank.
TEST_F(CommunicatorTest, MissingRankFailsRendezvous) {
  const int p = port();
  const std::string group = group_;
  auto outcomes = testing::RunRanks(2, [&](int rank) -> std::string {
    auto store = TcpStore::Connect("127.0.0.1", p, 5.0, testing::TestStoreCredentials());
    RANK_CHECK_OK(store.status());
    GlooCommunicatorOptions opts;
    opts.group = group;
    opts.rank = rank;
    opts.size = 3;  // rank 2 never comes
    opts.connect_timeout_seconds = 1.5;
    auto start = Clock::now();
    auto comm = GlooCommunicator::Create(**store, opts);
    double took = SecondsSince(start);
    std::fprintf(stderr, "rank %d after %.2f s: %s\n", rank, took,
                 comm.status().ToString().c_str());
    RANK_CHECK(comm.status().code() == StatusCode::kDeadlineExceeded);
    const std::string expected_start = fmt::format(
        "joining group MissingRankFailsRendezvous as rank {} of 3: rank 2 never joined: ", rank);
    RANK_CHECK_MSG(comm.status().message().rfind(expected_start, 0) == 0, comm.status().ToString());
    RANK_CHECK_MSG(
        comm.status().message().find("'MissingRankFailsRendezvous/2'") != std::string::npos,
        comm.status().ToString());
    RANK_CHECK_MSG(took < 4.0, comm.status().ToString());
    return "";
  });
  ExpectAllSucceeded(outcomes);
}

// Gloo's rendezvous also runs over a FileStore.
TEST(GlooCommunicator, RendezvousOverFileStore) {
  const std::string dir = testing::MakeTempDir("tessera-filestore");
  auto outcomes = testing::RunRanks(2, [&](int rank) -> std::string {
    auto store = FileStore::Open(dir);
    RANK_CHECK_OK(store.status());
    GlooCommunicatorOptions opts;
    opts.group = "file";
    opts.rank = rank;
    opts.size = 2;
    opts.timeout_seconds = 5.0;
    opts.connect_timeout_seconds = 5.0;
    auto comm = GlooCommunicator::Create(**store, opts);
    RANK_CHECK_OK(comm.status());
    float x[2] = {1.0f + rank, 10.0f * rank};
    RANK_CHECK_OK((*comm)->AllReduceSum(x, 2));
    RANK_CHECK(x[0] == 3.0f && x[1] == 10.0f);
    return "";
  });
  for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << testing::Describe(o);
}

TEST(GlooCommunicator, GroupOfOneNeedsNoPeers) {
  const std::string dir = testing::MakeTempDir("tessera-filestore");
  auto store = FileStore::Open(dir);
  ASSERT_TRUE(store.ok());
  GlooCommunicatorOptions opts;
  opts.group = "solo";
  auto comm = GlooCommunicator::Create(**store, opts);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  float x[3] = {1, 2, 3};
  EXPECT_TRUE((*comm)->AllReduceSum(x, 3).ok());
  EXPECT_EQ(x[2], 3.0f);
  float g[3];
  EXPECT_TRUE((*comm)->AllGather(x, 3, g).ok());
  EXPECT_EQ(g[1], 2.0f);
  EXPECT_TRUE((*comm)->Broadcast(x, sizeof(x), 0).ok());
  EXPECT_TRUE((*comm)->Barrier().ok());
  Status s = (*comm)->Send(x, sizeof(x), 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "send on rank 0 of group solo: peer 0 is not another rank of the group "
            "(size 1)");
  EXPECT_EQ((*comm)->Broadcast(x, sizeof(x), 1).code(), StatusCode::kInvalidArgument);

  opts.rank = 2;
  opts.size = 2;
  EXPECT_EQ(GlooCommunicator::Create(**store, opts).status().code(), StatusCode::kInvalidArgument);
}

// Stage-0 tp ranks fed different steps (issue 16 item 3): the per-prefill
// hash check turns a mismatch, of contents or of lengths, into the same
// kFailedPrecondition on every rank naming the ranks that differ, never a
// silently wrong sum or an abort; equal steps pass, and a decode-only step is
// not checked (no collective). Real rank processes over real Gloo.
TEST_F(CommunicatorTest, StepInputCheckNamesTheRanksFedOtherInputs) {
  constexpr int kRanks = 3;
  const int p = port();
  auto batch = [](std::vector<int32_t> ids) {
    StepBatch b;
    SeqStep s;
    s.seq_id = 0;
    s.num_tokens = static_cast<int32_t>(ids.size());
    s.prompt_len = s.num_tokens;
    s.want_logits = true;
    b.seqs.push_back(s);
    b.token_ids = std::move(ids);
    return b;
  };
  auto outcomes = testing::RunRanks(kRanks, [&](int rank) -> std::string {
    auto comm = Join(p, group_, rank, kRanks);
    RANK_CHECK_OK(comm.status());
    kernels::Backend& cpu = kernels::CpuBackend();
    const std::string who = "tp_rank " + std::to_string(rank);
    // Same prompt on every rank.
    RANK_CHECK_OK(CheckSameStepInputs(**comm, cpu, batch({5, 17, 42}), who));
    // Rank 2: same length, other ids; then rank 1: another length.
    for (int odd : {2, 1}) {
      std::vector<int32_t> ids = {5, 17, 42};
      if (rank == odd && odd == 2) ids[1] = 18;
      if (rank == odd && odd == 1) ids.push_back(7);
      Status st = CheckSameStepInputs(**comm, cpu, batch(ids), who);
      RANK_CHECK_MSG(st.code() == StatusCode::kFailedPrecondition, st.ToString());
      RANK_CHECK_MSG(st.message().find("tp_rank(s) " + std::to_string(odd) + " were given") !=
                         std::string::npos,
                     st.ToString());
    }
    // A decode step (one generated token per sequence) is not checked: the
    // ranks may pass different ones without a collective being run.
    StepBatch decode = batch({100 + rank});
    decode.seqs[0].start_pos = 3;
    decode.seqs[0].prompt_len = 3;
    RANK_CHECK_OK(CheckSameStepInputs(**comm, cpu, decode, who));
    // The group still works after the mismatches (nothing was broken).
    std::vector<float> one = {1.0f};
    RANK_CHECK_OK((*comm)->AllReduceSum(one.data(), 1));
    RANK_CHECK(one[0] == static_cast<float>(kRanks));
    return "";
  });
  ExpectAllSucceeded(outcomes);
}

}  // namespace
}  // namespace tessera
