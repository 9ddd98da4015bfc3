// Stage-0 ranks started with different prompts (issue 16 item 3), through
// the rank flags the local launcher uses (`tessera generate --rank R --store
// host:port`): the requests come from tp_rank 0 and reach every rank the
// same, so the answer is rank 0's prompt's, exactly as a one-process run,
// with equal and with different prompt lengths (before: silently wrong, or a
// SIGABRT on a Gloo size mismatch). Real rank processes, a real store.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/net/store_auth.h"
#include "support/store_process.h"
#include "support/test_util.h"

namespace tessera {
namespace {

std::string Model() { return ::tessera::testing::FixturePath("models/llama_gqa_f32"); }

// stdout of a one-process greedy run of `prompt`.
std::string OneProcess(const std::string& prompt) {
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-rank-inputs");
  const auto r = ::tessera::testing::RunCommand(
      ::tessera::testing::BinaryDir() + "/tessera generate --model " + Model() + " --prompt '" +
      prompt + "' --raw --max-tokens 8 2>" + dir + "/err");
  EXPECT_EQ(r.rc, 0) << ::tessera::testing::ReadFileOrDie(dir + "/err");
  // The answer, without the stats line (which names the layout).
  return r.output.substr(0, r.output.find("tessera: tp="));
}

struct RankRun {
  std::string out0;  // rank 0's stdout
  std::vector<int> status;
  std::string logs;
};

// Runs `tessera generate --tp 2` as two rank processes, rank r with
// prompts[r].
RankRun TwoRanks(const std::vector<std::string>& prompts) {
  auto store = ::tessera::testing::StoreProcess::Start();
  TESSERA_CHECK(store.ok());
  const std::string dir = ::tessera::testing::MakeTempDir("tessera-rank-inputs");
  setenv(kStoreSecretEnv, HexEncode(::tessera::testing::TestStoreSecret()).c_str(), 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(::tessera::testing::Spawn(
        {::tessera::testing::BinaryDir() + "/tessera", "generate", "--model", Model(), "--prompt",
         prompts[static_cast<size_t>(r)], "--raw", "--max-tokens", "8", "--tp", "2", "--timeout",
         "20", "--rank", std::to_string(r), "--store",
         "127.0.0.1:" + std::to_string((*store)->port())},
        dir + "/rank" + std::to_string(r) + ".log"));
  unsetenv(kStoreSecretEnv);
  RankRun run;
  // Bounded: --timeout 20 bounds every collective; a rank still running
  // after 120 s is killed (and fails the test: it did not exit 0).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (pid_t p : pids) {
    int st = 0;
    while (waitpid(p, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(p, SIGKILL);
        waitpid(p, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    run.status.push_back(st);
  }
  run.logs = ::tessera::testing::ReadFileOrDie(dir + "/rank0.log") + "\n---\n" +
             ::tessera::testing::ReadFileOrDie(dir + "/rank1.log");
  run.out0 = ::tessera::testing::ReadFileOrDie(dir + "/rank0.log");
  return run;
}

TEST(RankInputs, StageZeroRanksServeRankZerosPromptWhateverTheyWereGiven) {
  const std::string want = OneProcess("the quick brown fox");
  ASSERT_FALSE(want.empty());
  for (const std::string other : {"jumps over the dog", "a"}) {  // equal, then other length
    SCOPED_TRACE(other);
    RankRun run = TwoRanks({"the quick brown fox", other});
    for (int st : run.status) {
      EXPECT_TRUE(WIFEXITED(st)) << "signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0) << "\n"
                                 << run.logs;
      EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0) << run.logs;
    }
    // Rank 0's log holds its stdout (the answer) and stderr (the stats).
    EXPECT_NE(run.out0.find(want), std::string::npos) << "want: " << want << "\n" << run.logs;
  }
}

}  // namespace
}  // namespace tessera
