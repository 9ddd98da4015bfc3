// ZmqSocketLoop (common/net/zmq_loop.h): one owner thread per ZeroMQ socket.
// A real PAIR socket over inproc is owned by the loop; the test thread holds
// the other end. Posted sends run on the owner thread in order, the
// readable handler and the hooks run there too, a throwing handler does not
// end the loop, Stop still sends what was posted before it, and nothing is
// accepted after it.
#include "common/net/zmq_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

namespace tessera {
namespace {

using std::chrono::milliseconds;

// The loop's socket (bound) and the test's peer (connected), in one context.
struct Pair {
  zmq::context_t context{1};
  std::unique_ptr<zmq::socket_t> owned;  // the loop's, after Start
  zmq::socket_t peer{context, zmq::socket_type::pair};
  explicit Pair(const std::string& name) {
    owned = std::make_unique<zmq::socket_t>(context, zmq::socket_type::pair);
    owned->set(zmq::sockopt::linger, 1000);
    owned->bind("inproc://" + name);
    peer.set(zmq::sockopt::linger, 0);
    peer.set(zmq::sockopt::rcvtimeo, 5000);  // a missing message fails, not hangs
    peer.connect("inproc://" + name);
  }
};

// Records which threads ran the loop's callbacks.
struct Threads {
  std::mutex mu;
  std::set<std::thread::id> ids;  // guarded by mu
  void Note() {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  }
};

std::string Recv(zmq::socket_t& s) {
  zmq::message_t m;
  if (!s.recv(m)) return "<timeout>";
  return m.to_string();
}

TEST(ZmqSocketLoop, PostedSendsAndHandlersRunOnTheOneOwnerThreadInOrder) {
  Pair p("zmq-loop-test-order");
  ZmqSocketLoop loop(p.context, "zmq-loop-test");
  Threads threads;
  std::atomic<int> after_poll_calls{0};
  ZmqSocketLoop::Hooks hooks;
  zmq::socket_t* owned = p.owned.get();
  // Echo what the peer sends, with a prefix.
  hooks.watches = {{owned, [&] {
                      threads.Note();
                      zmq::message_t m;
                      while (owned->recv(m, zmq::recv_flags::dontwait))
                        owned->send(zmq::buffer("echo:" + m.to_string()));
                    }}};
  hooks.poll_timeout = [] { return milliseconds(50); };
  hooks.after_poll = [&] {
    threads.Note();
    ++after_poll_calls;
  };
  hooks.on_exit = [&] { owned->close(); };
  ASSERT_TRUE(loop.Start(std::move(hooks)).ok());
  EXPECT_TRUE(loop.running());
  EXPECT_EQ(loop.Start({}).code(), StatusCode::kFailedPrecondition);  // starts once

  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(loop.Post([&, i] {
      threads.Note();
      owned->send(zmq::buffer("m" + std::to_string(i)));
    }));
  }
  for (int i = 0; i < 100; ++i) ASSERT_EQ(Recv(p.peer), "m" + std::to_string(i));
  p.peer.send(zmq::buffer(std::string("hello")));
  EXPECT_EQ(Recv(p.peer), "echo:hello");
  EXPECT_GT(after_poll_calls.load(), 0);
  loop.Stop();
  EXPECT_FALSE(loop.running());
  std::lock_guard<std::mutex> lock(threads.mu);
  ASSERT_EQ(threads.ids.size(), 1u);
  EXPECT_NE(*threads.ids.begin(), std::this_thread::get_id());
}

TEST(ZmqSocketLoop, APostWakesALoopWaitingOnALongPoll) {
  Pair p("zmq-loop-test-wake");
  ZmqSocketLoop loop(p.context, "zmq-loop-test");
  ZmqSocketLoop::Hooks hooks;
  zmq::socket_t* owned = p.owned.get();
  hooks.watches = {{owned, [] {}}};
  hooks.poll_timeout = [] { return milliseconds(60000); };  // only the wake pipe ends a wait
  hooks.on_exit = [&] { owned->close(); };
  ASSERT_TRUE(loop.Start(std::move(hooks)).ok());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(loop.Post([owned] { owned->send(zmq::buffer(std::string("woken"))); }));
  EXPECT_EQ(Recv(p.peer), "woken");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // Stop wakes it too: this returns long before the 60 s poll would end.
  loop.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ZmqSocketLoop, AThrowingHandlerOrTaskDoesNotEndTheLoop) {
  Pair p("zmq-loop-test-throw");
  ZmqSocketLoop loop(p.context, "zmq-loop-test");
  ZmqSocketLoop::Hooks hooks;
  zmq::socket_t* owned = p.owned.get();
  hooks.watches = {{owned, [owned] {
                      zmq::message_t m;
                      while (owned->recv(m, zmq::recv_flags::dontwait)) {
                        if (m.to_string() == "boom") throw std::runtime_error("handler failed");
                        owned->send(zmq::buffer("ok:" + m.to_string()));
                      }
                    }}};
  hooks.poll_timeout = [] { return milliseconds(20); };
  hooks.on_exit = [&] { owned->close(); };
  ASSERT_TRUE(loop.Start(std::move(hooks)).ok());
  ASSERT_TRUE(loop.Post([] { throw std::runtime_error("task failed"); }));
  ASSERT_TRUE(loop.Post([owned] { owned->send(zmq::buffer(std::string("after-task"))); }));
  EXPECT_EQ(Recv(p.peer), "after-task");  // the task after the throwing one still ran
  p.peer.send(zmq::buffer(std::string("boom")));
  p.peer.send(zmq::buffer(std::string("again")));
  EXPECT_EQ(Recv(p.peer), "ok:again");
  loop.Stop();
}

TEST(ZmqSocketLoop, StopSendsWhatWasPostedAndRefusesLaterPosts) {
  Pair p("zmq-loop-test-stop");
  ZmqSocketLoop loop(p.context, "zmq-loop-test");
  EXPECT_FALSE(loop.Post([] {}));  // not started
  loop.Wake();                     // a no-op before Start
  bool exited = false;
  ZmqSocketLoop::Hooks hooks;
  zmq::socket_t* owned = p.owned.get();
  hooks.watches = {{owned, [] {}}};
  hooks.poll_timeout = [] { return milliseconds(20); };
  hooks.on_exit = [&] {
    exited = true;
    owned->close();
  };
  ASSERT_TRUE(loop.Start(std::move(hooks)).ok());
  std::atomic<bool> release{false};
  // Holds the owner thread so the posts below are still queued at Stop.
  ASSERT_TRUE(loop.Post([&release] {
    while (!release.load()) std::this_thread::sleep_for(milliseconds(1));
  }));
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(loop.Post([owned, i] { owned->send(zmq::buffer("q" + std::to_string(i))); }));
  std::thread stopper([&loop] { loop.Stop(); });
  while (!loop.stopping()) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_FALSE(loop.Post([] {}));  // refused once Stop began
  release = true;
  stopper.join();
  EXPECT_TRUE(exited);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Recv(p.peer), "q" + std::to_string(i));
  EXPECT_FALSE(loop.Post([] {}));
  loop.Stop();  // idempotent
}

TEST(ZmqSocketLoop, StartNeedsAPollTimeout) {
  zmq::context_t context{1};
  ZmqSocketLoop loop(context, "zmq-loop-test");
  EXPECT_EQ(loop.Start({}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(loop.running());
}

}  // namespace
}  // namespace tessera
