// Fault bounds of `tessera generate --tp/--pp` (issue: fault bounds that do
// not hold): a rank stopped (SIGSTOP) or killed (SIGKILL) at the rendezvous
// or while decoding ends the whole launch within --timeout + 2 s, with
// exit status 1 and a report naming the rank, and no rank process is left.
// Real rank processes of the real binary; the faults are real signals.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/test_util.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using ::tessera::testing::BinaryDir;
using ::tessera::testing::FixturePath;
using ::tessera::testing::MakeTempDir;
using ::tessera::testing::ReadFileOrDie;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// TESSERA_SMOLLM2_DIR, else the repository's models/default (made by setup).
std::string SmolLM2Dir() {
  if (const char* d = std::getenv("TESSERA_SMOLLM2_DIR")) return d;
  const std::string fallback = FixturePath("../../models/default");
  return std::ifstream(fallback + "/config.json").good() ? fallback : "";
}

// The pid of the child of `parent` whose command line has "--rank <rank>",
// or nullopt.
std::optional<pid_t> RankPid(pid_t parent, int rank) {
  DIR* proc = opendir("/proc");
  if (!proc) return std::nullopt;
  std::optional<pid_t> found;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline");
    std::string arg;
    std::vector<std::string> args;
    while (std::getline(cmd, arg, '\0')) args.push_back(arg);
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--rank" && args[i + 1] == std::to_string(rank)) found = pid;
    }
    if (found) break;
  }
  closedir(proc);
  return found;
}

struct Launch {
  pid_t pid = -1;
  std::string out;  // stdout file
  std::string err;  // stderr file
  Clock::time_point started;
};

Launch Start(const std::string& args) {
  Launch l;
  const std::string dir = MakeTempDir("tessera-faults");
  l.out = dir + "/out";
  l.err = dir + "/err";
  l.started = Clock::now();
  l.pid = ::tessera::testing::Spawn(
      {"/bin/sh", "-c", "exec " + BinaryDir() + "/tessera " + args + " >" + l.out + " 2>" + l.err},
      dir + "/sh.log");
  return l;
}

// Waits up to `seconds` for the launch to exit; its exit status, or -1 when
// it is still running (then it is killed, with its ranks).
int WaitExit(Launch& l, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (Clock::now() < deadline) {
    if (waitpid(l.pid, &status, WNOHANG) == l.pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(l.pid, SIGKILL);  // its ranks die with it (PR_SET_PDEATHSIG)
  waitpid(l.pid, &status, 0);
  return -1;
}

// Polls for rank `rank` of the launch to exist (bounded).
pid_t WaitForRank(const Launch& l, int rank) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    if (auto p = RankPid(l.pid, rank)) return *p;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

TEST(LauncherFaults, AStageStoppedWhileDecodingEndsTheRunWithinTheTimeout) {
  const std::string model = SmolLM2Dir();
  ASSERT_FALSE(model.empty()) << "no SmolLM2 model: run scripts/setup or set TESSERA_SMOLLM2_DIR";
  const double timeout = 3.0;
  Launch l = Start("generate --model " + model +
                   " --prompt 'Once upon a time' --raw --max-tokens 200 --ignore-eos --pp 2"
                   " --timeout 3");
  const pid_t rank1 = WaitForRank(l, 1);
  ASSERT_GT(rank1, 0) << ReadFileOrDie(l.err);
  // Decoding has started once rank 0 prints text.
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  struct stat st {};
  while (Clock::now() < deadline && (stat(l.out.c_str(), &st) != 0 || st.st_size == 0)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GT(st.st_size, 0) << "no text within 120 s: " << ReadFileOrDie(l.err);
  ASSERT_EQ(kill(rank1, SIGSTOP), 0);
  const auto stopped = Clock::now();
  const int rc = WaitExit(l, 30.0);
  const double took = SecondsSince(stopped);
  const std::string err = ReadFileOrDie(l.err);
  ASSERT_NE(rc, -1) << "still running 30 s after rank 1 was stopped:\n" << err;
  EXPECT_EQ(rc, 1) << err;
  EXPECT_LE(took, timeout + 2.0) << err;
  EXPECT_NE(err.find("rank 1 (stage 1, tp_rank 0) was killed after that failure"),
            std::string::npos)
      << err;
  EXPECT_FALSE(Alive(rank1));
}

TEST(LauncherFaults, ARankKilledAtTheRendezvousEndsTheRunWithinTwoSeconds) {
  Launch l = Start("generate --model " + FixturePath("models/llama_gqa_f32") +
                   " --prompt 'the quick brown fox' --raw --max-tokens 8 --tp 2 --timeout 10");
  const pid_t rank1 = WaitForRank(l, 1);
  ASSERT_GT(rank1, 0) << ReadFileOrDie(l.err);
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  const auto killed = Clock::now();
  const int rc = WaitExit(l, 30.0);
  const double took = SecondsSince(killed);
  const std::string err = ReadFileOrDie(l.err);
  ASSERT_NE(rc, -1) << "still running 30 s after rank 1 was killed:\n" << err;
  EXPECT_EQ(rc, 1) << err;
  EXPECT_LE(took, 2.0) << err;
  EXPECT_NE(err.find("rank 1 (stage 0, tp_rank 1) was killed by signal"), std::string::npos) << err;
}

TEST(LauncherFaults, ARankStoppedAtTheRendezvousEndsTheRunWithinTheTimeout) {
  const double timeout = 3.0;
  Launch l = Start("generate --model " + FixturePath("models/llama_gqa_f32") +
                   " --prompt 'the quick brown fox' --raw --max-tokens 8 --tp 2 --timeout 3");
  const pid_t rank1 = WaitForRank(l, 1);
  ASSERT_GT(rank1, 0) << ReadFileOrDie(l.err);
  ASSERT_EQ(kill(rank1, SIGSTOP), 0);
  const auto stopped = Clock::now();
  const int rc = WaitExit(l, 90.0);
  const double took = SecondsSince(stopped);
  const std::string err = ReadFileOrDie(l.err);
  ASSERT_NE(rc, -1) << "still running 90 s after rank 1 was stopped:\n" << err;
  EXPECT_EQ(rc, 1) << err;
  EXPECT_LE(took, timeout + 2.0) << err;
  EXPECT_NE(err.find("rank 1 (stage 0, tp_rank 1) was killed after that failure"),
            std::string::npos)
      << err;
  EXPECT_FALSE(Alive(rank1));
}

}  // namespace
}  // namespace tessera
