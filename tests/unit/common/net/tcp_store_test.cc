#include "common/net/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/multi_process.h"
#include "support/store_process.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::unique_ptr<TcpStoreServer> StartServer() {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, testing::TestStoreOptions());
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return std::move(server).value();
}

std::unique_ptr<TcpStore> ConnectTo(const TcpStoreServer& server) {
  auto client = TcpStore::Connect("127.0.0.1", server.port(), 5.0, testing::TestStoreCredentials());
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return std::move(client).value();
}

// A port that nothing listens on (bound once to find it, then released).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  TESSERA_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(TcpStore, SetGetOverwriteBinaryValues) {
  auto server = StartServer();
  EXPECT_GT(server->port(), 0);
  auto store = ConnectTo(*server);
  std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(store->Set("k/1", binary).ok());
  auto v = store->Get("k/1", 1.0);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, binary);
  ASSERT_TRUE(store->Set("k/1", "second").ok());
  EXPECT_EQ(*store->Get("k/1", 1.0), "second");
  ASSERT_TRUE(store->Set("empty", "").ok());
  EXPECT_EQ(*store->Get("empty", 0), "");
  // A second client sees the first one's keys.
  auto other = ConnectTo(*server);
  EXPECT_EQ(*other->Get("k/1", 0), "second");
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  auto server = StartServer();
  auto reader = ConnectTo(*server);
  auto writer = ConnectTo(*server);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(writer->Set("late", "here").ok());
  });
  auto start = Clock::now();
  auto v = reader->Get("late", 5.0);
  double took = SecondsSince(start);
  t.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "here");
  EXPECT_GE(took, 0.15);
  EXPECT_LT(took, 2.0);
}

TEST(TcpStore, GetTimeoutNamesTheKey) {
  auto server = StartServer();
  auto store = ConnectTo(*server);
  auto start = Clock::now();
  auto v = store->Get("tp.stage1/3", 0.3);
  double took = SecondsSince(start);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("'tp.stage1/3'"), std::string::npos) << v.status().ToString();
  EXPECT_NE(v.status().message().find("0.3 s"), std::string::npos) << v.status().ToString();
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 1.5);
  // The connection stays usable after a timeout.
  ASSERT_TRUE(store->Set("tp.stage1/3", "x").ok());
  EXPECT_EQ(*store->Get("tp.stage1/3", 0.3), "x");
}

TEST(TcpStore, WaitNamesOnlyTheMissingKeys) {
  auto server = StartServer();
  auto store = ConnectTo(*server);
  ASSERT_TRUE(store->Set("a", "1").ok());
  Status s = store->Wait({"a", "b", "c"}, 0.2);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  const std::string tail = "waiting for keys 'b', 'c'";
  ASSERT_GE(s.message().size(), tail.size()) << s.ToString();
  EXPECT_EQ(s.message().substr(s.message().size() - tail.size()), tail) << s.ToString();

  auto writer = ConnectTo(*server);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(writer->Set("b", "2").ok());
    EXPECT_TRUE(writer->Set("c", "3").ok());
  });
  s = store->Wait({"a", "b", "c"}, 5.0);
  t.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(TcpStore, AddIsAtomicAcrossClients) {
  auto server = StartServer();
  constexpr int kThreads = 4, kAdds = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      auto c = TcpStore::Connect("127.0.0.1", server->port(), 5.0, testing::TestStoreCredentials());
      if (!c.ok()) {
        ++failures;
        return;
      }
      for (int k = 0; k < kAdds; ++k) {
        if (!(*c)->Add("counter", 1).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto store = ConnectTo(*server);
  auto v = store->Add("counter", -10);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, kThreads * kAdds - 10);
  EXPECT_EQ(*store->Get("counter", 0), std::to_string(kThreads * kAdds - 10));
  EXPECT_EQ(*store->Add("fresh", 5), 5);

  ASSERT_TRUE(store->Set("text", "hello").ok());
  auto bad = store->Add("text", 1);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'text'"), std::string::npos) << bad.status().ToString();
}

TEST(TcpStore, ConnectRetriesUntilTheServerStarts) {
  int port = FreePort();
  std::unique_ptr<TcpStoreServer> server;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto s = TcpStoreServer::Start("127.0.0.1", port, testing::TestStoreOptions());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server = std::move(s).value();
  });
  auto client = TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials());
  t.join();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->Set("k", "v").ok());
}

TEST(TcpStore, NoServerIsUnavailable) {
  int port = FreePort();
  auto start = Clock::now();
  auto client = TcpStore::Connect("127.0.0.1", port, 0.3, testing::TestStoreCredentials());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << client.status().ToString();
  EXPECT_LT(SecondsSince(start), 2.0);
}

TEST(TcpStore, ServerStoppedWhileAClientWaits) {
  auto server = StartServer();
  auto store = ConnectTo(*server);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server.reset();
  });
  auto start = Clock::now();
  auto v = store->Get("never", 10.0);
  t.join();
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().ToString();
  EXPECT_NE(v.status().message().find("get('never')"), std::string::npos) << v.status().ToString();
  EXPECT_LT(SecondsSince(start), 2.0);
  // The next call finds nobody to reconnect to.
  EXPECT_EQ(store->Set("k", "v").code(), StatusCode::kUnavailable);
}

// The server runs in its own process, which is SIGKILLed while a client is
// blocked in Get: the client must answer kUnavailable, not hang.
TEST(TcpStore, ServerProcessKilledWhileAClientWaits) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(p[0]);
    auto server = TcpStoreServer::Start("127.0.0.1", 0, testing::TestStoreOptions());
    int port = server.ok() ? (*server)->port() : -1;
    if (write(p[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    pause();  // serve until killed
    _exit(0);
  }
  close(p[1]);
  int port = -1;
  ASSERT_EQ(read(p[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  close(p[0]);
  ASSERT_GT(port, 0);
  auto client = TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    kill(pid, SIGKILL);
  });
  auto start = Clock::now();
  auto v = (*client)->Get("never", 10.0);
  double took = SecondsSince(start);
  killer.join();
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().ToString();
  EXPECT_NE(v.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << v.status().ToString();
  EXPECT_LT(took, 2.0);
  auto again = (*client)->Get("k", 1.0);
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable) << again.status().ToString();
}

// Several processes rendezvous through one server: each publishes its key,
// then reads everyone's, and counts itself in.
TEST(TcpStore, ManyProcessesRendezvous) {
  auto server = testing::StoreProcess::Start();  // RunRanks forks this process
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  constexpr int kRanks = 4;
  auto outcomes = testing::RunRanks(kRanks, [port](int rank) -> std::string {
    auto store = TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials());
    RANK_CHECK_OK(store.status());
    RANK_CHECK_OK((*store)->Set("addr/" + std::to_string(rank), "rank" + std::to_string(rank)));
    for (int r = 0; r < kRanks; ++r) {
      auto v = (*store)->Get("addr/" + std::to_string(r), 5.0);
      RANK_CHECK_OK(v.status());
      RANK_CHECK(*v == "rank" + std::to_string(r));
    }
    RANK_CHECK_OK((*store)->Add("arrived", 1).status());
    return "";
  });
  for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << testing::Describe(o);
  auto store = TcpStore::Connect("127.0.0.1", port, 5.0, testing::TestStoreCredentials());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(*(*store)->Get("arrived", 0), std::to_string(kRanks));
}

}  // namespace
}  // namespace tessera
