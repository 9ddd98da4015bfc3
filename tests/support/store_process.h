// A TcpStoreServer in a child process of its own, for tests that fork ranks
// with RunRanks (multi_process.h).
//
// Why a process: a TcpStoreServer runs an I/O thread. A test that starts it
// in the test process and then forks ranks forks a multi-threaded process,
// and a fork taken while that thread holds an allocator lock leaves the child
// stuck on it forever. glibc's malloc guards its locks across fork; the
// allocators of clang 14's sanitizers do not, so under ASan ranks hung before
// running a line of their body. With the server in its own process the test
// process stays single-threaded and every fork is safe.
//
// Start() forks the server process from the calling thread; call it while the
// test process has no other thread (gtest's SetUp or the test body, before
// anything starts threads). The destructor closes the control pipe, on which
// the child exits, and reaps it (SIGKILL after 5 s).
//
// Thread-safety: one owner; not copyable.
#pragma once

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "common/base/status.h"
#include "common/net/tcp_store.h"

namespace tessera::testing {

// The store secret of tests: fixed, so a process forked at any time (a
// server, a rank) agrees with its parent. Tests that check authentication
// use their own secrets.
inline std::string TestStoreSecret() { return "tessera-tests-store-secret-32-by"; }
inline StoreCredentials TestStoreCredentials() {
  return StoreCredentials::Admin(TestStoreSecret());
}
inline TcpStoreServerOptions TestStoreOptions() {
  TcpStoreServerOptions o;
  o.secret = TestStoreSecret();
  return o;
}

class StoreProcess {
 public:
  // Starts a TcpStoreServer on 127.0.0.1 (a free port) in a child process;
  // clients authenticate with TestStoreCredentials().
  // Errors: kInternal when fork/pipe fail or the child cannot start the
  // server (its message is returned), or does not answer within 10 s.
  static StatusOr<std::unique_ptr<StoreProcess>> Start() {
    int ctl[2], ans[2];
    if (pipe(ctl) != 0 || pipe(ans) != 0) return Internal(fmt::format("pipe: {}", strerror(errno)));
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return Internal(fmt::format("fork: {}", strerror(errno)));
    if (pid == 0) {
      close(ctl[1]);
      close(ans[0]);
      auto server = TcpStoreServer::Start("127.0.0.1", 0, TestStoreOptions());
      const std::string reply =
          server.ok() ? std::to_string((*server)->port()) : "error: " + server.status().ToString();
      if (write(ans[1], reply.data(), reply.size()) < 0) _exit(1);
      close(ans[1]);
      for (char c;;) {  // until the parent closes ctl[1] (or dies)
        const ssize_t k = read(ctl[0], &c, 1);
        if (k == 0 || (k < 0 && errno != EINTR)) break;
      }
      if (server.ok()) server->reset();
      _exit(0);
    }
    close(ctl[0]);
    close(ans[1]);
    auto proc = std::unique_ptr<StoreProcess>(new StoreProcess(pid, ctl[1]));
    std::string reply;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{ans[0], POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t k = read(ans[0], buf, sizeof(buf));
      if (k <= 0) break;  // the child wrote everything and closed its end
      reply.append(buf, static_cast<size_t>(k));
    }
    close(ans[0]);
    if (reply.empty() || reply.rfind("error: ", 0) == 0) {
      return Internal(fmt::format("store server process {}: {}", pid,
                                  reply.empty() ? "no answer within 10 s" : reply));
    }
    proc->port_ = std::stoi(reply);
    return proc;
  }

  ~StoreProcess() {
    close(ctl_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;

  // The port the server listens on (127.0.0.1).
  int port() const { return port_; }

 private:
  StoreProcess(pid_t pid, int ctl) : pid_(pid), ctl_(ctl) {}

  const pid_t pid_;
  const int ctl_;  // write end of the control pipe; closing it ends the child
  int port_ = -1;
};

}  // namespace tessera::testing
