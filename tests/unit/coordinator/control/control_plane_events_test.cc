// Control plane events: WorkerActivity (coordinator/control/worker_activity.h) and the
// registrations, losses, closed connections and watched messages that notify it, over real
// ZeroMQ sockets on tcp://127.0.0.1.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "coordinator/control/control_server.h"
#include "coordinator/control/worker_activity.h"
#include "support/control_plane_peers.h"
#include "worker/daemon/control_client.h"

namespace tessera {
namespace {

// ---------------------------------------------------------------------------
// Events: WorkerActivity (coordinator/control/worker_activity.h).

// Far past any test's run: a wait that returns before it returned on an
// event (the generation moved), not on a timer.
constexpr std::chrono::seconds kNoDeadline{60};

TEST(WorkerActivity, AWaitReturnsOnTheEventNotAtItsDeadline) {
  WorkerActivity activity;
  const uint64_t seen = activity.generation();
  uint64_t woke = seen;
  std::thread waiter([&] { woke = activity.WaitChange(seen, Clock::now() + kNoDeadline); });
  activity.Notify();
  waiter.join();
  EXPECT_EQ(woke, seen + 1);
  // A generation that moved already: no wait at all.
  EXPECT_EQ(activity.WaitChange(seen), seen + 1);
  EXPECT_EQ(activity.WaitChange(seen, Clock::now() + kNoDeadline), seen + 1);
  // No event: the wait ends at its deadline with the generation unchanged.
  EXPECT_EQ(activity.WaitChange(seen + 1, Clock::now() + milliseconds(1)), seen + 1);
}

// Which bodies the server delivered, for a test thread to wait on.
struct Delivered {
  std::mutex mu;
  std::condition_variable cv;
  std::map<Envelope::BodyCase, int> count;

  void Add(Envelope::BodyCase body) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++count[body];
    }
    cv.notify_all();
  }
  // Whether `n` messages of `body` arrived within kNoDeadline.
  bool Await(Envelope::BodyCase body, int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kNoDeadline, [&] { return count[body] >= n; });
  }
};

TEST(ControlPlane, RegistrationsLossesClosedConnectionsAndWatchedMessagesAreEvents) {
  Delivered delivered;
  ControlServerOptions o;
  o.heartbeat_interval = milliseconds(60000);  // no loss by missed heartbeats here
  o.linger = milliseconds(0);
  o.on_message = [&delivered](const ControlPeer&, const Envelope& e) {
    delivered.Add(e.body_case());
  };
  ControlServer server(std::move(o));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  WorkerActivity& activity = server.activity();

  // A registration is an event, after on_message saw it.
  uint64_t seen = activity.generation();
  ClientLog clog;
  auto client = std::make_unique<ControlClient>(ClientOptions(&clog));
  ASSERT_TRUE(client->Connect(*endpoint).ok());
  ASSERT_TRUE(client->Register(ValidRegisterBody(), "w1").ok());
  ASSERT_TRUE(client->WaitRegistered(milliseconds(30000)).ok());
  seen = activity.WaitChange(seen, Clock::now() + kNoDeadline);
  ASSERT_EQ(seen, 1u) << "the registration was no event";
  EXPECT_TRUE(delivered.Await(Envelope::kRegisterWorker, 1));

  // A message of a worker nobody watches is no event; the next one after
  // Watch is one, and only that one.
  ASSERT_TRUE(client->Send(ValidLoadProgress()).ok());
  ASSERT_TRUE(delivered.Await(Envelope::kLoadProgress, 1));
  server.Watch({"w1", "nobody"});
  ASSERT_TRUE(client->Send(ValidLoaded()).ok());
  EXPECT_EQ(activity.WaitChange(seen, Clock::now() + kNoDeadline), seen + 1)
      << "the watched worker's message was no event";
  ASSERT_TRUE(delivered.Await(Envelope::kLoaded, 1));
  ASSERT_TRUE(client->Send(ValidLoadProgress()).ok());  // the watch was used up
  ASSERT_TRUE(delivered.Await(Envelope::kLoadProgress, 2));
  // Every message so far is in; of them only the registration and the
  // watched one advanced the generation.
  EXPECT_EQ(activity.generation(), seen + 1);
  seen = activity.generation();

  // Its connection closing is an event (the worker exited); so is its loss,
  // 0.2 s later (kClosedConnectionGraceSeconds): whichever comes first, the
  // record shows it.
  client.reset();
  seen = activity.WaitChange(seen, Clock::now() + kNoDeadline);
  std::vector<ControlWorkerInfo> w1 = server.WorkersOf({"w1"});
  ASSERT_EQ(w1.size(), 1u);
  EXPECT_TRUE(w1[0].connection_closed || !w1[0].alive);

  // A second worker, declared lost by the coordinator: an event at once.
  ClientLog clog2;
  ControlClient second(ClientOptions(&clog2));
  ASSERT_TRUE(second.Connect(*endpoint).ok());
  ASSERT_TRUE(second.Register(ValidRegisterBody(), "w2").ok());
  ASSERT_TRUE(second.WaitRegistered(milliseconds(30000)).ok());
  const uint64_t before = activity.generation();
  ASSERT_TRUE(server.DeclareLost("w2", "a test"));
  EXPECT_GT(activity.generation(), before);
}

}  // namespace
}  // namespace tessera
