// The rendezvous store's defences (issue #14 item 4), each attack reproduced
// against the real TcpStoreServer over loopback sockets, and the poisoning
// attack against the real daemons: a client without the deployment's key
// can neither read nor write, a recorded request cannot be replayed, frame
// size, connections, keys and bytes are bounded (the refusal names the
// config key), a plan's prefix is written only by that plan's ranks, and
// garbage pre-set under the next plan's prefix cannot break a re-plan.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <thread>

#include "common/config/daemon_config.h"
#include "common/net/http_client.h"
#include "common/net/store_auth.h"
#include "common/net/tcp_store.h"
#include "common/net/tcp_store_wire.h"
#include "support/daemons_fixture.h"
#include "support/store_process.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using namespace store_wire;
using Clock = std::chrono::steady_clock;

// ---- A hand-written store client, to speak the protocol wrongly ----------

class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawConn() {
    if (fd_ >= 0) close(fd_);
  }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool connected() const { return connected_; }

  // False once the peer closed (EPIPE/ECONNRESET).
  bool Send(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // One frame's payload; nullopt on EOF, error or `timeout_s`.
  std::optional<std::string> ReadFrame(double timeout_s = 5.0) {
    char h[4];
    if (!ReadExact(h, 4, timeout_s)) return std::nullopt;
    const uint32_t len = DecodeU32(h);
    if (len > (16u << 20)) return std::nullopt;
    std::string p(len, '\0');
    if (!ReadExact(p.data(), len, timeout_s)) return std::nullopt;
    return p;
  }

  // True when the peer closes within `timeout_s` (frames before it are
  // skipped).
  bool ClosedWithin(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
    }
    return false;
  }

  // Runs the handshake as `identity` with `key`; false when refused. Keeps
  // the session for Request.
  bool Authenticate(const std::string& identity, const std::string& key,
                    std::string* refusal = nullptr) {
    auto hello = ReadFrame();
    if (!hello || hello->size() != 1 + kStoreNonceBytes) return false;
    server_nonce_ = hello->substr(1);
    client_nonce_ = std::string(kStoreNonceBytes, 'n');
    if (!Send(Frame(AuthFrame(identity, key)))) return false;
    auto answer = ReadFrame();
    if (!answer) return false;
    if ((*answer)[0] != kResultOk) {
      if (refusal) *refusal = *answer;
      return false;
    }
    if (answer->substr(1) != ServerProof(key, server_nonce_, client_nonce_)) return false;
    session_ = SessionKey(key, server_nonce_, client_nonce_);
    return true;
  }
  // The AUTH payload for the current challenge.
  std::string AuthFrame(const std::string& identity, const std::string& key) const {
    std::string auth;
    PutU8(&auth, kOpAuth);
    PutStr(&auth, identity);
    auth += client_nonce_;
    auth += AuthMac(key, server_nonce_, client_nonce_, identity);
    return auth;
  }
  // A tagged request frame (the next in sequence).
  std::string TaggedFrame(const std::string& body) {
    return Frame(body + FrameTag(session_, kClientToServer, send_seq_++, body));
  }
  // Sends `body` tagged, returns the reply body (its tag checked).
  std::optional<std::string> Request(const std::string& body) {
    if (!Send(TaggedFrame(body))) return std::nullopt;
    auto reply = ReadFrame();
    if (!reply || reply->size() < kStoreTagBytes) return std::nullopt;
    std::string b = reply->substr(0, reply->size() - kStoreTagBytes);
    if (reply->substr(reply->size() - kStoreTagBytes) !=
        FrameTag(session_, kServerToClient, recv_seq_++, b))
      return std::nullopt;
    return b;
  }

 private:
  bool ReadExact(char* buf, size_t len, double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    size_t done = 0;
    while (done < len) {
      pollfd p{fd_, POLLIN, 0};
      if (Clock::now() >= deadline) return false;
      if (poll(&p, 1, 50) <= 0) continue;
      ssize_t n = recv(fd_, buf + done, len - done, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string server_nonce_, client_nonce_, session_;
  uint64_t send_seq_ = 0, recv_seq_ = 0;
};

std::string SetBody(const std::string& key, const std::string& value) {
  std::string b;
  PutU8(&b, kOpSet);
  PutStr(&b, key);
  PutStr(&b, value);
  return b;
}

// An ERROR reply's message ("" for anything else).
std::string ErrorMessage(const std::string& body) {
  Reader r(body);
  uint8_t result = 0, code = 0;
  std::string m;
  if (r.U8(&result) && result == kResultError && r.U8(&code) && r.Str(&m)) return m;
  return "";
}

const std::string kSecret = "0123456789abcdef0123456789abcdef";

std::unique_ptr<TcpStoreServer> StartServer(TcpStoreLimits limits = {}) {
  TcpStoreServerOptions o;
  o.secret = kSecret;
  o.limits = limits;
  auto s = TcpStoreServer::Start("127.0.0.1", 0, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<TcpStore> Admin(const TcpStoreServer& s) {
  auto c = TcpStore::Connect("127.0.0.1", s.port(), 5.0, StoreCredentials::Admin(kSecret));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Waits (bounded) until `pred(server.stats())` holds.
template <class Pred>
bool AwaitStats(const TcpStoreServer& s, Pred pred, double seconds = 10.0) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  while (Clock::now() < deadline) {
    if (pred(s.stats())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred(s.stats());
}

int64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// ---- Authentication --------------------------------------------------------

TEST(StoreAuth, ClientWithoutTheKeyCanNeitherWriteNorRead) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  auto admin = Admin(*server);
  ASSERT_TRUE(admin);
  ASSERT_TRUE(admin->Set("plan1/secret", "value").ok());

  // The old, unauthenticated protocol: a plain SET frame as the first frame.
  RawConn plain(server->port());
  ASSERT_TRUE(plain.connected());
  ASSERT_TRUE(plain.ReadFrame().has_value());  // the challenge
  plain.Send(Frame(SetBody("plan2/tp.stage0/0", "garbage")));
  auto refusal = plain.ReadFrame();
  ASSERT_TRUE(refusal.has_value());
  EXPECT_NE(ErrorMessage(*refusal).find("malformed handshake"), std::string::npos)
      << ErrorMessage(*refusal);
  EXPECT_TRUE(plain.ClosedWithin(5.0));

  // A guessed secret: the handshake fails, naming the identity.
  auto guessed = TcpStore::Connect("127.0.0.1", server->port(), 5.0,
                                   StoreCredentials::Admin(std::string(32, 'x')));
  ASSERT_FALSE(guessed.ok());
  EXPECT_EQ(guessed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(guessed.status().message().find("authentication failed for identity 'admin'"),
            std::string::npos)
      << guessed.status().ToString();

  // Nothing was written; the real key still works.
  auto got = admin->Get("plan2/tp.stage0/0", 0);
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*admin->Get("plan1/secret", 0), "value");
  EXPECT_GE(server->stats().auth_failures, 2);
}

TEST(StoreAuth, RecordedRequestsCannotBeReplayed) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  auto admin = Admin(*server);
  ASSERT_TRUE(admin);
  // A legitimate session, as an eavesdropper would record it.
  RawConn legit(server->port());
  ASSERT_TRUE(legit.Authenticate("admin", kSecret));
  const std::string recorded_auth = legit.AuthFrame("admin", kSecret);
  const std::string recorded_set = legit.TaggedFrame(SetBody("k", "1"));
  ASSERT_TRUE(legit.Send(recorded_set));
  auto ok = legit.ReadFrame();
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ((*ok)[0], kResultOk);
  ASSERT_TRUE(admin->Set("k", "2").ok());

  // Replayed on the same connection: its sequence number is spent.
  ASSERT_TRUE(legit.Send(recorded_set));
  auto refused = legit.ReadFrame();
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->find("does not verify"), std::string::npos);
  EXPECT_TRUE(legit.ClosedWithin(5.0));

  // Replayed on a new connection: the server's challenge differs, so the
  // recorded AUTH fails, and so would the request's tag.
  RawConn replay(server->port());
  ASSERT_TRUE(replay.ReadFrame().has_value());
  ASSERT_TRUE(replay.Send(Frame(recorded_auth)));
  auto answer = replay.ReadFrame();
  ASSERT_TRUE(answer.has_value());
  EXPECT_NE(ErrorMessage(*answer).find("authentication failed"), std::string::npos);
  replay.Send(recorded_set);
  EXPECT_TRUE(replay.ClosedWithin(5.0));
  EXPECT_EQ(*admin->Get("k", 0), "2");
}

TEST(StoreAuth, IdleConnectionsAreBoundedAndClosedAfterTheHandshakeTimeout) {
  TcpStoreLimits l;
  l.max_connections = 16;
  l.handshake_timeout_seconds = 1.0;
  auto server = StartServer(l);
  ASSERT_TRUE(server);
  // 300 idle connections that never authenticate (the attack opened 3,000;
  // this process's descriptor limit is the bound here).
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 300; ++i) {
    idle.push_back(std::make_unique<RawConn>(server->port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  // Each was displaced by a newer one or timed out.
  EXPECT_TRUE(AwaitStats(*server, [](const StoreServerCore::Stats& s) {
    return s.refused_connections + s.auth_failures >= 300 - 16;
  }));
  EXPECT_LE(server->stats().connections, 16);
  // A rank still gets in (it displaces the oldest idle handshake) and works.
  auto admin = Admin(*server);
  ASSERT_TRUE(admin);
  EXPECT_TRUE(admin->Set("k", "v").ok());
  // Every idle connection is closed: displaced, or at the timeout.
  for (auto& c : idle) EXPECT_TRUE(c->ClosedWithin(5.0));
  EXPECT_TRUE(admin->Set("k", "w").ok());
  EXPECT_TRUE(
      AwaitStats(*server, [](const StoreServerCore::Stats& s) { return s.connections == 1; }));
}

TEST(StoreAuth, WhenEverySlotIsAuthenticatedANewConnectionIsRefusedNamingTheKey) {
  TcpStoreLimits l;
  l.max_connections = 4;
  auto server = StartServer(l);
  ASSERT_TRUE(server);
  std::vector<std::unique_ptr<TcpStore>> ranks;
  for (int i = 0; i < 4; ++i) {
    ranks.push_back(Admin(*server));
    ASSERT_TRUE(ranks.back());
  }
  // Retried until the timeout, then refused naming the key.
  auto fifth =
      TcpStore::Connect("127.0.0.1", server->port(), 0.5, StoreCredentials::Admin(kSecret));
  ASSERT_FALSE(fifth.ok());
  EXPECT_EQ(fifth.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(fifth.status().message().find("store.max_connections (4)"), std::string::npos)
      << fifth.status().ToString();
  for (auto& r : ranks) EXPECT_TRUE(r->Set("k", "v").ok());
  // A slot freed while a client retries lets it in.
  ranks.pop_back();
  auto later =
      TcpStore::Connect("127.0.0.1", server->port(), 5.0, StoreCredentials::Admin(kSecret));
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_TRUE((*later)->Set("k", "w").ok());
}

// ---- Limits ---------------------------------------------------------------

TEST(StoreLimits, HugeFramesAreCutOffWithoutBeingBuffered) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const int64_t rss_before = RssBytes();
  // Four clients announce 64 MiB frames and stream them (the attack took
  // the coordinator from 15 to 294 MB): before authenticating...
  const std::string chunk(1 << 20, 'x');
  std::vector<std::thread> senders;
  std::atomic<int> cut_off{0};
  for (int i = 0; i < 4; ++i) {
    senders.emplace_back([&] {
      RawConn c(server->port());
      std::string header;
      PutU32(&header, 64u << 20);
      bool alive = c.Send(header);
      for (int m = 0; m < 64 && alive; ++m) alive = c.Send(chunk);
      if (!alive || c.ClosedWithin(5.0)) ++cut_off;
    });
  }
  for (auto& t : senders) t.join();
  EXPECT_EQ(cut_off.load(), 4);
  // ...and after: the refusal names the key, before the body is read.
  RawConn authed(server->port());
  ASSERT_TRUE(authed.Authenticate("admin", kSecret));
  std::string header;
  PutU32(&header, 64u << 20);
  ASSERT_TRUE(authed.Send(header));
  auto reply = authed.ReadFrame();
  ASSERT_TRUE(reply.has_value());
  EXPECT_NE(reply->find("exceeds store.max_frame_bytes (1048576)"), std::string::npos);
  EXPECT_TRUE(authed.ClosedWithin(5.0));
  EXPECT_TRUE(AwaitStats(*server, [](const StoreServerCore::Stats& s) {
    return s.connections == 0 && s.buffered_bytes < (1 << 20);
  }));
  // This process holds the server: 4 x 64 MiB buffered would show.
  EXPECT_LT(RssBytes() - rss_before, 32 << 20);
}

TEST(StoreLimits, KeysAndBytesAreBoundedAndTheErrorNamesTheKey) {
  TcpStoreLimits l;
  l.max_keys = 1000;
  l.max_bytes = 64 << 10;
  auto server = StartServer(l);
  ASSERT_TRUE(server);
  auto admin = Admin(*server);
  ASSERT_TRUE(admin);
  // The attack set 200k keys; the store takes max_keys of them.
  int accepted = 0;
  Status last;
  for (int i = 0; i < 2000; ++i) {
    Status s = admin->Set("k" + std::to_string(i), "v");
    if (s.ok()) {
      ++accepted;
    } else {
      last = s;
    }
  }
  EXPECT_EQ(accepted, 1000);
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(last.message().find("store.max_keys (1000)"), std::string::npos) << last.ToString();
  EXPECT_TRUE(admin->Set("k5", "overwrite").ok());  // an existing key still changes
  auto add = admin->Add("counter", 1);
  EXPECT_EQ(add.status().code(), StatusCode::kResourceExhausted);
  // Bytes: a value that would pass max_bytes is refused, naming it.
  Status big = admin->Set("k6", std::string(70 << 10, 'b'));
  EXPECT_EQ(big.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("store.max_bytes (65536"), std::string::npos) << big.ToString();
  EXPECT_TRUE(AwaitStats(*server, [](const StoreServerCore::Stats& s) {
    return s.keys == 1000 && s.bytes <= (64 << 10);
  }));
}

// ---- Plan prefixes --------------------------------------------------------

TEST(StorePlans, APlansPrefixIsWrittenOnlyByThatPlansRanks) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  server->OpenPlan(1, 2, "plan1/");
  auto r0 =
      TcpStore::Connect("127.0.0.1", server->port(), 5.0, StoreCredentials::Rank(kSecret, 1, 0));
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  EXPECT_TRUE((*r0)->Set("plan1//tp.stage0/0", "addr").ok());
  // Not the next plan's keys, nor anyone else's.
  Status s = (*r0)->Set("plan2//tp.stage0/0", "garbage");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("only keys under its plan's prefix 'plan1/'"), std::string::npos)
      << s.ToString();
  EXPECT_EQ((*r0)->Get("other", 0).status().code(), StatusCode::kFailedPrecondition);
  // A rank the plan does not have, and the next plan before it opens.
  auto r5 =
      TcpStore::Connect("127.0.0.1", server->port(), 5.0, StoreCredentials::Rank(kSecret, 1, 5));
  EXPECT_EQ(r5.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r5.status().message().find("plan 1 has 2 ranks"), std::string::npos)
      << r5.status().ToString();
  auto early =
      TcpStore::Connect("127.0.0.1", server->port(), 5.0, StoreCredentials::Rank(kSecret, 2, 0));
  EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("plan 2 is not the store's current plan"),
            std::string::npos)
      << early.status().ToString();
  // A plan-1 rank's key does not pass for a plan-2 identity.
  StoreCredentials forged{StoreRankIdentity(2, 0), StoreKeyFor(kSecret, StoreRankIdentity(1, 0))};
  server->OpenPlan(2, 2, "plan2/");
  auto f = TcpStore::Connect("127.0.0.1", server->port(), 5.0, forged);
  EXPECT_EQ(f.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(f.status().message().find("wrong store key"), std::string::npos);
  // Plan 2 opened: its ranks get in, plan 1's keys are gone and its ranks out.
  auto p2 =
      TcpStore::Connect("127.0.0.1", server->port(), 5.0, StoreCredentials::Rank(kSecret, 2, 1));
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  EXPECT_TRUE((*p2)->Set("plan2//tp.stage0/1", "addr").ok());
  auto admin = Admin(*server);
  ASSERT_TRUE(admin);
  EXPECT_EQ(admin->Get("plan1//tp.stage0/0", 0).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE((*r0)->Set("plan1//x", "late").ok());
  auto again =
      TcpStore::Connect("127.0.0.1", server->port(), 5.0, StoreCredentials::Rank(kSecret, 1, 0));
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

// ---- The [store] keys ------------------------------------------------------

TEST(StoreConfig, LimitsHaveDefaultsAndBadValuesNameFileLineAndKey) {
  auto d = ParseDaemonConfig("", "x.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->store.max_frame_bytes, 1 << 20);
  EXPECT_EQ(d->store.max_connections, 512);
  EXPECT_EQ(d->store.max_keys, 65536);
  EXPECT_EQ(d->store.max_bytes, 64 << 20);
  EXPECT_EQ(d->store.handshake_timeout_seconds, 5.0);
  auto c = ParseDaemonConfig("[store]\nmax_keys = 10\nmax_bytes = 4096\n", "x.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->store.max_keys, 10);
  EXPECT_EQ(c->store.max_bytes, 4096);
  const std::pair<std::string, std::string> bad[] = {
      {"[store]\nmax_frame_bytes = 100\n",
       "x.toml:2:19: store.max_frame_bytes: must be in 4096..1073741824, got 100"},
      {"[store]\nmax_connections = 0\n", "x.toml:2:19: store.max_connections: must be >= 1, got 0"},
      {"[store]\nmax_keys = -1\n", "x.toml:2:12: store.max_keys: must be >= 1, got -1"},
      {"[store]\nmax_bytes = 0\n", "x.toml:2:13: store.max_bytes: must be >= 1, got 0"},
      {"[store]\nhandshake_timeout_seconds = 0.0\n",
       "x.toml:2:29: store.handshake_timeout_seconds: must be a finite number > 0, got 0.0"},
  };
  for (const auto& [text, error] : bad) {
    auto r = ParseDaemonConfig(text, "x.toml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), error) << text;
  }
}

// ---- The poisoning attack against the daemons ----------------------------

// tp=2 x pp=2 on four workers. The attacker, a local process without the
// deployment's secret, pre-sets garbage under the next plans' prefixes; then a
// worker is killed -9 during 8 streaming requests. The re-plan must succeed
// and every request complete.
// The daemons of tests/support/daemons_fixture.h (tp=2 x pp=2, four workers).
using StoreDaemons = Daemons;

TEST_F(StoreDaemons, PoisonedNextPlanPrefixDoesNotBreakTheReplan) {
  const std::string& dir = dir_;
  const int port = port_;
  const std::string log = ::tessera::testing::ReadFileOrDie(dir + "/coordinator.log");
  // The store's address is in the log, as docs/operations.md says.
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(log, m, std::regex("rendezvous store listening on 127\\.0\\.0\\.1:(\\d+)")))
      << log;
  const int store_port = std::stoi(m[1]);

  // The attack: garbage under the prefixes of plans 2..4, by a plain client
  // and by one guessing a key. Every write is refused.
  int refused = 0;
  for (int plan = 2; plan <= 4; ++plan) {
    for (const std::string group : {"/tp.stage0", "/tp.stage1", "/act.stage0-1.tp0"}) {
      for (int rank = 0; rank < 4; ++rank) {
        RawConn c(store_port);
        ASSERT_TRUE(c.ReadFrame().has_value());
        c.Send(Frame(SetBody(
            "plan" + std::to_string(plan) + "/" + group + "/" + std::to_string(rank), "garbage")));
        auto reply = c.ReadFrame();
        if (reply && !ErrorMessage(*reply).empty() && c.ClosedWithin(5.0)) ++refused;
      }
    }
    auto guess = TcpStore::Connect("127.0.0.1", store_port, 5.0,
                                   StoreCredentials::Rank(std::string(32, 'g'), plan, 0));
    EXPECT_FALSE(guess.ok());
  }
  EXPECT_EQ(refused, 3 * 3 * 4);
  // The refusals show in the coordinator's metrics.
  const std::string metrics = HttpCall(port, "GET", "/metrics").body;
  std::smatch auth;
  ASSERT_TRUE(std::regex_search(
      metrics, auth, std::regex("tessera_store_refusals_total\\{reason=\"auth\"\\} (\\d+)")))
      << metrics;
  EXPECT_GE(std::stoi(auth[1]), 3 * 3 * 4 + 3);
  EXPECT_NE(metrics.find("tessera_store_keys "), std::string::npos);

  // A worker dies mid-stream; 8 requests are in flight.
  std::vector<HttpReply> replies(8);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      nlohmann::json req = {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5, 17 + i}},
                            {"max_tokens", 60},         {"stream", true},
                            {"ignore_eos", true},       {"temperature", 0}};
      replies[i] = HttpCall(port, "POST", "/v1/completions", req.dump());
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(cluster_->worker_pid(3), SIGKILL);
  for (auto& t : clients) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(replies[i].status, 200) << i;
    EXPECT_EQ(replies[i].body.find("error"), std::string::npos) << i << ": " << replies[i].body;
    ASSERT_FALSE(replies[i].events.empty()) << i;
    EXPECT_EQ(replies[i].events.back(), "[DONE]") << i;
  }
  const Status ready_again = cluster_->WaitReady(30);
  EXPECT_TRUE(ready_again.ok()) << ready_again.ToString();
  EXPECT_NE(::tessera::testing::ReadFileOrDie(dir + "/coordinator.log").find("plan 2"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
