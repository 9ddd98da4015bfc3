// Runs a test body as several real processes (one per rank) with fork(2), for
// tests of the store and the communicators.
//
// Each child runs body(rank) and reports through a pipe what it returned: ""
// for success, else a failure description. The child then _exit()s, so it
// never runs the gtest machinery or static destructors it inherited. The
// parent collects every child's message, exit status and wall time, and
// SIGKILLs any child still running at the deadline.
//
// Thread-safety: call from the test's main thread, while it is the only
// thread of the test process: a child forked while another thread holds an
// allocator lock hangs on it (the sanitizers' allocators in clang 14 are not
// fork-safe). Run a store server with StoreProcess (store_process.h), not
// in a thread of the test.
#pragma once

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/status.h"

namespace tessera::testing {

struct RankOutcome {
  int rank = -1;
  pid_t pid = -1;
  bool exited = false;              // exited on its own (see exit_code)
  int exit_code = -1;               // 0 when the body returned ""
  int signal = 0;                   // the signal that ended it, if any
  bool killed_at_deadline = false;  // still running at the deadline
  std::string message;              // what the body returned
  double seconds = 0;               // wall time from fork to exit
};

// "rank 1: pid 1234 exited 1: <message>", for test failure output.
inline std::string Describe(const RankOutcome& o) {
  std::string how = o.killed_at_deadline ? "killed at the deadline"
                    : o.signal           ? fmt::format("killed by signal {}", o.signal)
                                         : fmt::format("exited {}", o.exit_code);
  return fmt::format("rank {}: pid {} {} after {:.2f} s: {}", o.rank, o.pid, how, o.seconds,
                     o.message.empty() ? "(no message)" : o.message);
}

// Forks `n` children; child r runs body(r). Returns when every child has
// ended, killing those still running after `deadline_seconds`.
inline std::vector<RankOutcome> RunRanks(int n, const std::function<std::string(int)>& body,
                                         double deadline_seconds = 14.0) {
  using Clock = std::chrono::steady_clock;
  std::fflush(nullptr);  // nothing buffered may be written twice
  std::vector<RankOutcome> out(n);
  std::vector<int> fds(n, -1);
  std::vector<Clock::time_point> start(n);
  for (int r = 0; r < n; ++r) {
    int p[2];
    TESSERA_CHECK(pipe(p) == 0);
    start[r] = Clock::now();
    pid_t pid = fork();
    TESSERA_CHECK(pid >= 0);
    if (pid == 0) {
      close(p[0]);
      std::string msg;
      try {
        msg = body(r);
      } catch (const std::exception& e) {
        msg = std::string("uncaught exception: ") + e.what();
      } catch (...) {
        msg = "uncaught exception";
      }
      size_t done = 0;
      while (done < msg.size()) {
        ssize_t w = write(p[1], msg.data() + done, msg.size() - done);
        if (w <= 0) break;
        done += static_cast<size_t>(w);
      }
      _exit(msg.empty() ? 0 : 1);
    }
    close(p[1]);
    fds[r] = p[0];
    out[r].rank = r;
    out[r].pid = pid;
  }
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(deadline_seconds));
  int running = n;
  std::vector<bool> done(n, false);
  while (running > 0) {
    // Drain pipes so a long message never blocks a child.
    std::vector<pollfd> pfds;
    for (int r = 0; r < n; ++r) {
      if (fds[r] >= 0) pfds.push_back({fds[r], POLLIN, 0});
    }
    poll(pfds.data(), pfds.size(), 5);
    for (int r = 0; r < n; ++r) {
      if (fds[r] < 0) continue;
      pollfd p{fds[r], POLLIN, 0};
      while (poll(&p, 1, 0) > 0) {
        char buf[4096];
        ssize_t k = read(fds[r], buf, sizeof(buf));
        if (k <= 0) {
          close(fds[r]);
          fds[r] = -1;
          break;
        }
        out[r].message.append(buf, static_cast<size_t>(k));
      }
    }
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      pid_t w = waitpid(out[r].pid, &status, WNOHANG);
      if (w == out[r].pid) {
        done[r] = true;
        --running;
        out[r].seconds = std::chrono::duration<double>(Clock::now() - start[r]).count();
        if (WIFEXITED(status)) {
          out[r].exited = true;
          out[r].exit_code = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
          out[r].signal = WTERMSIG(status);
        }
      }
    }
    if (running > 0 && Clock::now() >= deadline) {
      for (int r = 0; r < n; ++r) {
        if (done[r]) continue;
        kill(out[r].pid, SIGKILL);
        int status = 0;
        waitpid(out[r].pid, &status, 0);
        done[r] = true;
        --running;
        out[r].killed_at_deadline = true;
        out[r].signal = SIGKILL;
        out[r].seconds = std::chrono::duration<double>(Clock::now() - start[r]).count();
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    if (fds[r] < 0) continue;
    char buf[4096];
    ssize_t k;
    while ((k = read(fds[r], buf, sizeof(buf))) > 0) out[r].message.append(buf, k);
    close(fds[r]);
  }
  return out;
}

}  // namespace tessera::testing

// Checks for use inside a RunRanks body (which returns std::string): on
// failure they return a description naming the file, line and expression.
#define RANK_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) return fmt::format("{}:{}: check failed: {}", __FILE__, __LINE__, #cond); \
  } while (0)

#define RANK_CHECK_MSG(cond, msg)                                                        \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      return fmt::format("{}:{}: check failed: {}: {}", __FILE__, __LINE__, #cond, msg); \
    }                                                                                    \
  } while (0)

#define RANK_CHECK_OK(expr)                                                                       \
  do {                                                                                            \
    ::tessera::Status _rank_st = (expr);                                                          \
    if (!_rank_st.ok()) {                                                                         \
      return fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #expr, _rank_st.ToString()); \
    }                                                                                             \
  } while (0)
