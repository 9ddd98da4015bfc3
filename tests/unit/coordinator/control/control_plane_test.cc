// Control plane: the ControlServer / ControlClient pair over real ZeroMQ
// sockets on tcp://127.0.0.1 (the Envelope codec's rules:
// tests/unit/common/wire/control_codec_test.cc).
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/wire/control_codec.h"
#include "coordinator/control/control_server.h"
#include "support/control_envelopes.h"
#include "support/control_plane_peers.h"
#include "worker/daemon/control_client.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(ControlPlane, RegisterAndAckRoundTrip) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  EXPECT_EQ(endpoint->rfind("tcp://127.0.0.1:", 0), 0u) << *endpoint;
  EXPECT_NE(endpoint->back(), '*');

  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "worker-0");
  EXPECT_TRUE(client.registered());
  EXPECT_EQ(client.worker_id(), "worker-0");
  ASSERT_TRUE(
      WaitUntil([&] { return clog.Count(Envelope::kRegisterAck) == 1; }, milliseconds(1000)));
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    const control::RegisterAck& ack = clog.messages[0].register_ack();
    EXPECT_TRUE(ack.accepted());
    EXPECT_EQ(ack.heartbeat_interval_ms(), 1000u);
    EXPECT_EQ(ack.heartbeat_miss_limit(), 3u);
  }
  // The coordinator side saw the Register once, under the assigned id.
  ASSERT_TRUE(
      WaitUntil([&] { return slog.Count(Envelope::kRegisterWorker) == 1; }, milliseconds(1000)));
  std::optional<Envelope> reg = slog.Last(Envelope::kRegisterWorker);
  EXPECT_EQ(reg->worker_id(), "worker-0");
  EXPECT_EQ(reg->register_worker().host(), "host-a");
  EXPECT_EQ(reg->register_worker().devices_size(), 2);
  std::vector<ControlWorkerInfo> workers = server.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id, "worker-0");
  EXPECT_EQ(workers[0].identity, client.routing_id());
  EXPECT_TRUE(workers[0].alive);
  EXPECT_EQ(workers[0].registration->pid(), 4242u);

  // A second worker gets the id it asks for; a third asking for the same id
  // is refused with the reason.
  ClientLog clog2, clog3;
  ControlClient named(ClientOptions(&clog2));
  ASSERT_TRUE(named.Connect(*endpoint).ok());
  ASSERT_TRUE(named.Register(ValidRegisterBody(), "gpu-a").ok());
  StatusOr<std::string> named_id = named.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(named_id.ok()) << named_id.status().ToString();
  EXPECT_EQ(*named_id, "gpu-a");
  ControlClient twin(ClientOptions(&clog3));
  ASSERT_TRUE(twin.Connect(*endpoint).ok());
  ASSERT_TRUE(twin.Register(ValidRegisterBody(), "gpu-a").ok());
  StatusOr<std::string> refused = twin.WaitRegistered(milliseconds(3000));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("worker_id 'gpu-a' is held by live peer " +
                                            named.routing_id()),
            std::string::npos)
      << refused.status().ToString();
  EXPECT_FALSE(twin.registered());
  EXPECT_EQ(twin.Send(ValidLoaded()).code(), StatusCode::kFailedPrecondition);
  const ControlServerStats st = server.stats();
  EXPECT_EQ(st.registrations_accepted, 2u);
  EXPECT_EQ(st.registrations_refused, 1u);
}

TEST(ControlPlane, RegisterRefusedByTheHook) {
  ServerLog slog;
  ControlServerOptions o = ServerOptions(&slog, milliseconds(1000));
  o.accept_register = [](const ControlPeer&, const control::Register& r) {
    if (r.build_version() != TESSERA_VERSION)
      return FailedPrecondition("worker build " + r.build_version() + " != coordinator build " +
                                TESSERA_VERSION);
    return Status::Ok();
  };
  ControlServer server(std::move(o));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  control::Register r = ValidRegisterBody();
  r.set_build_version("0.0.1-old");
  ASSERT_TRUE(client.Register(r).ok());
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("worker build 0.0.1-old != coordinator build"),
            std::string::npos)
      << id.status().ToString();
  EXPECT_TRUE(server.Workers().empty());
  EXPECT_EQ(slog.Count(Envelope::kRegisterWorker), 0u);
}

TEST(ControlPlane, HeartbeatsKeepAWorkerAlive) {
  ServerLog slog;
  // A 50 ms interval and a loss window of 10 beats (500 ms): the window must hold a
  // scheduling stall of the client's heartbeat thread on a loaded machine (a 200 ms window
  // declared it lost once, at a load of 7 on 2 cores), and still be far below the observation.
  ControlServer server(ServerOptions(&slog, milliseconds(50), 10));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  control::Heartbeat hb;
  hb.set_state(control::WORKER_STATE_READY);
  hb.set_plan_version(5);
  hb.set_rss_bytes(123456);
  client.SetHeartbeat(hb);
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  ASSERT_TRUE(client.WaitRegistered(milliseconds(3000)).ok());
  // Three times the 500 ms loss window.
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_EQ(slog.Lost(), 0u);
  const size_t beats = slog.Count(Envelope::kHeartbeat);
  EXPECT_GE(beats, 10u) << "1500 ms at a 50 ms interval";
  EXPECT_LE(beats, 40u);
  std::optional<Envelope> last = slog.Last(Envelope::kHeartbeat);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->worker_id(), "worker-0");
  EXPECT_EQ(last->heartbeat().state(), control::WORKER_STATE_READY);
  EXPECT_EQ(last->heartbeat().plan_version(), 5u);
  EXPECT_EQ(last->heartbeat().rss_bytes(), 123456u);
  std::vector<ControlWorkerInfo> workers = server.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_TRUE(workers[0].alive);
  EXPECT_LT(workers[0].seconds_since_last_message, 0.5);
  // The client counts a heartbeat after its send returns, so the server may
  // hold one it has not counted yet (TSan once showed 12 vs 13): compare once
  // its thread stopped.
  client.Stop();
  EXPECT_GE(client.stats().heartbeats_sent, beats);
}

TEST(ControlPlane, SilentWorkerIsReportedLostWithinTheTimeout) {
  ServerLog slog;
  // Lost after 4 x 100 ms of silence. The margins are for a sanitizer build
  // on a loaded 2-core machine, where a thread may wait 100s of ms for a core
  // (CI once saw this test fail under TSan with 50 ms x 4 and a 0.6 s bound).
  ControlServer server(ServerOptions(&slog, milliseconds(100), 4));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog_a;
  ControlClient stays(ClientOptions(&clog_a));
  ASSERT_TRUE(stays.Connect(*endpoint).ok());
  ASSERT_TRUE(stays.Register(ValidRegisterBody(), "stays").ok());
  ASSERT_TRUE(stays.WaitRegistered(milliseconds(3000)).ok());
  // "leaves" registers, then falls silent with its connection open (a
  // stopped process, a hung host): only the missing heartbeats tell.
  RawDealer leaves(*endpoint, "leaves-peer");
  Envelope reg = ValidRegister();
  reg.set_worker_id("leaves");
  leaves.Send(Serialize(reg));
  std::optional<Envelope> ack = leaves.Recv(milliseconds(3000));
  ASSERT_TRUE(ack.has_value() && ack->register_ack().accepted());
  const Clock::time_point silent_from = Clock::now();

  ASSERT_TRUE(WaitUntil([&] { return slog.Lost() >= 1; }, milliseconds(3000)));
  std::pair<std::string, Clock::time_point> lost;
  ControlWorkerLoss loss;
  Clock::time_point last_heard;
  {
    std::lock_guard<std::mutex> lock(slog.mu);
    lost = slog.lost[0];
    loss = slog.losses[0];
    for (size_t i = 0; i < slog.messages.size(); ++i)
      if (slog.messages[i].first.worker_id == "leaves") last_heard = slog.received[i];
  }
  EXPECT_EQ(lost.first, "leaves");
  EXPECT_EQ(loss.cause, ControlWorkerLoss::Cause::kMissedHeartbeats);
  // The loss dates from its last message, not from the declaration.
  EXPECT_LE(loss.since, silent_from);
  EXPECT_LE(loss.since, last_heard);
  // Declared lost once 4 intervals passed since its last message, found by a
  // check that runs every 25 ms (the bound leaves a second for scheduling).
  const double silent = std::chrono::duration<double>(lost.second - last_heard).count();
  EXPECT_GE(silent, 0.4);
  EXPECT_LE(silent, 1.4);
  EXPECT_GE(std::chrono::duration<double>(lost.second - loss.since).count(), 0.4);
  // Only that one; the other keeps heartbeating.
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(slog.Lost(), 1u);
  for (const ControlWorkerInfo& w : server.Workers()) EXPECT_EQ(w.alive, w.worker_id == "stays");
  Envelope drain;
  drain.mutable_drain()->set_reason("test");
  Status send = server.Send("leaves", drain);
  EXPECT_EQ(send.code(), StatusCode::kUnavailable) << send.ToString();
  EXPECT_EQ(server.stats().workers_lost, 1u);
  EXPECT_EQ(server.stats().connections_closed, 0u);
  // A new worker may take over the lost one's id.
  ClientLog clog_c;
  ControlClient returns(ClientOptions(&clog_c));
  ASSERT_TRUE(returns.Connect(*endpoint).ok());
  ASSERT_TRUE(returns.Register(ValidRegisterBody(), "leaves").ok());
  StatusOr<std::string> again = returns.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(server.Send("leaves", drain).ok());
  EXPECT_TRUE(WaitUntil([&] { return clog_c.Count(Envelope::kDrain) == 1; }, milliseconds(2000)));
}

// A worker whose connection closes (its process exited or was killed: the
// kernel closes its sockets) is lost after the short grace, long before its
// heartbeats would run out (here 50 x 100 ms); the one that stays is not.
TEST(ControlPlane, AClosedConnectionIsReportedLostAfterTheGraceNotTheTimeout) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(100), 50));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog_a, clog_b;
  ControlClient stays(ClientOptions(&clog_a));
  ControlClient leaves(ClientOptions(&clog_b));
  ASSERT_TRUE(stays.Connect(*endpoint).ok());
  ASSERT_TRUE(leaves.Connect(*endpoint).ok());
  ASSERT_TRUE(stays.Register(ValidRegisterBody(), "stays").ok());
  ASSERT_TRUE(leaves.Register(ValidRegisterBody(), "leaves").ok());
  ASSERT_TRUE(stays.WaitRegistered(milliseconds(3000)).ok());
  ASSERT_TRUE(leaves.WaitRegistered(milliseconds(3000)).ok());

  const Clock::time_point closed = Clock::now();
  leaves.Stop();  // closes its socket
  ASSERT_TRUE(WaitUntil([&] { return slog.Lost() >= 1; }, milliseconds(4000)));
  std::pair<std::string, Clock::time_point> lost;
  ControlWorkerLoss loss;
  {
    std::lock_guard<std::mutex> lock(slog.mu);
    lost = slog.lost[0];
    loss = slog.losses[0];
  }
  EXPECT_EQ(lost.first, "leaves");
  EXPECT_EQ(loss.cause, ControlWorkerLoss::Cause::kConnectionClosed);
  EXPECT_STREQ(loss.reason(), "its control connection closed");
  // The loss dates from the close; it is declared after the grace.
  EXPECT_GE(loss.since, closed);
  const double after_close = std::chrono::duration<double>(lost.second - closed).count();
  const double declared_after = std::chrono::duration<double>(lost.second - loss.since).count();
  EXPECT_GE(declared_after, kClosedConnectionGraceSeconds);
  EXPECT_LT(after_close, 2.0) << "the heartbeat timeout is 5 s";
  EXPECT_EQ(server.stats().connections_closed, 1u);
  for (const ControlWorkerInfo& w : server.Workers()) EXPECT_EQ(w.alive, w.worker_id == "stays");
}

// A coordinator restart: the worker's client keeps its socket, the new
// server answers its heartbeats with "register again", and the client
// registers again by itself with the same id and its updated registration
// (the shard it holds).
TEST(ControlPlane, ClientRegistersAgainWithARestartedServer) {
  ServerLog first_log;
  auto first = std::make_unique<ControlServer>(ServerOptions(&first_log, milliseconds(50)));
  StatusOr<std::string> endpoint = first->Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  control::Register held = ValidRegisterBody();
  *held.mutable_held_shard() = ValidAssignShard().assign_shard();
  ASSERT_TRUE(client.UpdateRegistration(held).ok());
  first->Stop();
  first.reset();

  ServerLog second_log;
  ControlServer second(ServerOptions(&second_log, milliseconds(50)));
  StatusOr<std::string> again = second.Start(*endpoint);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return second_log.Count(Envelope::kRegisterWorker) == 1; },
                        milliseconds(5000)));
  const std::optional<Envelope> reg = second_log.Last(Envelope::kRegisterWorker);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->worker_id(), *id);
  EXPECT_TRUE(reg->register_worker().has_held_shard());
  EXPECT_EQ(reg->register_worker().held_shard().plan_version(),
            ValidAssignShard().assign_shard().plan_version());
  // Registered again: heartbeats are heard, and the worker can be addressed.
  ASSERT_TRUE(
      WaitUntil([&] { return second_log.Count(Envelope::kHeartbeat) >= 2; }, milliseconds(3000)));
  Envelope drain;
  drain.mutable_drain()->set_reason("test");
  EXPECT_TRUE(second.Send(*id, drain).ok());
  EXPECT_TRUE(WaitUntil([&] { return clog.Count(Envelope::kDrain) == 1; }, milliseconds(2000)));
}

TEST(ControlPlane, BadMessagesAreDroppedAndTheServerKeepsServing) {
  ServerLog slog;
  ControlServerOptions o = ServerOptions(&slog, milliseconds(1000));
  o.max_message_bytes = 4096;
  ControlServer server(std::move(o));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());

  RawDealer rogue(*endpoint, "rogue");
  auto wait_drops = [&](size_t n) {
    return WaitUntil([&] { return slog.Drops() >= n; }, milliseconds(2000));
  };
  rogue.Send(std::string(12, '\xff'));
  ASSERT_TRUE(wait_drops(1));
  Envelope future = ValidHeartbeat();
  future.set_protocol_version(99);
  rogue.Send(Serialize(future));
  ASSERT_TRUE(wait_drops(2));
  rogue.Send(Serialize(ValidLoaded()));  // valid, but rogue never registered
  ASSERT_TRUE(wait_drops(3));
  rogue.Send(std::string(5000, '\0'));  // over the 4096-byte limit
  ASSERT_TRUE(wait_drops(4));
  rogue.SendTwoFrames(Serialize(ValidLoaded()), "extra");
  ASSERT_TRUE(wait_drops(5));
  Envelope bad_register = ValidRegister();
  bad_register.mutable_register_worker()->clear_host();
  rogue.Send(Serialize(bad_register));
  ASSERT_TRUE(wait_drops(6));
  {
    std::lock_guard<std::mutex> lock(slog.mu);
    const std::vector<std::string> expect = {
        "12 bytes is not a valid protobuf Envelope",
        "protocol_version 99 is not supported",
        "loaded from a peer that is not registered (worker_id 'w1')",
        "message of 5000 bytes exceeds the limit of 4096 bytes",
        "expected 1 payload frame after the routing id, got 2",
        "register_worker: host is empty",
    };
    ASSERT_EQ(slog.drops.size(), expect.size());
    for (size_t i = 0; i < expect.size(); ++i) {
      EXPECT_EQ(slog.drops[i].first.identity, "rogue");
      EXPECT_NE(slog.drops[i].second.message().find(expect[i]), std::string::npos)
          << "drop " << i << ": " << slog.drops[i].second.ToString();
    }
    EXPECT_TRUE(slog.messages.empty());
  }
  ControlServerStats st = server.stats();
  EXPECT_EQ(st.dropped_malformed, 4u);
  EXPECT_EQ(st.dropped_version, 1u);
  EXPECT_EQ(st.dropped_unregistered, 1u);
  EXPECT_EQ(st.frames_received, 6u);
  EXPECT_TRUE(server.Workers().empty());

  // The server still serves: a good worker registers and is heard.
  ClientLog clog;
  ControlClient good(ClientOptions(&clog));
  ASSERT_TRUE(good.Connect(*endpoint).ok());
  ASSERT_TRUE(good.Register(ValidRegisterBody()).ok());
  StatusOr<std::string> id = good.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(good.Send(ValidLoaded()).ok());
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kLoaded) == 1; }, milliseconds(2000)));

  // A registered peer is still held to the rules: its own id only, only the
  // bodies a worker sends, and a repeated Register is answered without a
  // second registration.
  RawDealer peer(*endpoint, "raw-peer");
  peer.Send(Serialize(ValidRegister()));
  std::optional<Envelope> ack = peer.Recv(milliseconds(2000));
  ASSERT_TRUE(ack.has_value());
  ASSERT_TRUE(ack->register_ack().accepted());
  const std::string raw_id = ack->register_ack().worker_id();
  peer.Send(Serialize(ValidRegister()));
  std::optional<Envelope> ack2 = peer.Recv(milliseconds(2000));
  ASSERT_TRUE(ack2.has_value());
  EXPECT_EQ(ack2->register_ack().worker_id(), raw_id);
  EXPECT_GT(ack2->seq(), ack->seq());
  const size_t drops_before = slog.Drops();
  peer.Send(Serialize(ValidHeartbeat(*id)));  // the other worker's id
  Envelope step = ValidStep();
  step.set_worker_id(raw_id);
  peer.Send(Serialize(step));  // a coordinator -> worker body
  ASSERT_TRUE(wait_drops(drops_before + 2));
  {
    std::lock_guard<std::mutex> lock(slog.mu);
    EXPECT_NE(slog.drops[drops_before].second.message().find("heartbeat carries worker_id '" + *id +
                                                             "', but this peer registered as '" +
                                                             raw_id + "'"),
              std::string::npos)
        << slog.drops[drops_before].second.ToString();
    EXPECT_NE(
        slog.drops[drops_before + 1].second.message().find("step is not a message a worker sends"),
        std::string::npos);
  }
  peer.Send(Serialize(ValidHeartbeat(raw_id)));
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kHeartbeat) >= 1; }, milliseconds(2000)));
  EXPECT_EQ(slog.Count(Envelope::kRegisterWorker), 2u);  // good + raw-peer, once each
  EXPECT_EQ(server.stats().registrations_accepted, 2u);
}

TEST(ControlPlane, CoordinatorAndWorkerExchangeMessages) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClientOptions co = ClientOptions(&clog);
  // The worker answers an AssignShard with LoadProgress and Loaded from its
  // own thread (Send is legal inside the handler).
  ControlClient* self = nullptr;
  co.on_message = [&](const Envelope& e) {
    {
      std::lock_guard<std::mutex> lock(clog.mu);
      clog.messages.push_back(e);
    }
    if (e.has_assign_shard()) {
      Envelope p = ValidLoadProgress();
      p.mutable_load_progress()->set_plan_version(e.assign_shard().plan_version());
      EXPECT_TRUE(self->Send(p).ok());
      Envelope l = ValidLoaded();
      l.mutable_loaded()->set_plan_version(e.assign_shard().plan_version());
      EXPECT_TRUE(self->Send(l).ok());
    }
  };
  ControlClient client(std::move(co));
  self = &client;
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody(), "w1").ok());
  ASSERT_TRUE(client.WaitRegistered(milliseconds(3000)).ok());

  Envelope assign = ValidAssignShard();
  assign.clear_worker_id();
  assign.clear_seq();
  ASSERT_TRUE(server.Send("w1", assign).ok());
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kLoaded) == 1; }, milliseconds(2000)));
  EXPECT_EQ(slog.Count(Envelope::kLoadProgress), 1u);
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    ASSERT_EQ(clog.messages.size(), 2u);  // the ack, then the assignment
    const Envelope& got = clog.messages[1];
    EXPECT_EQ(got.worker_id(), "w1");
    EXPECT_EQ(got.assign_shard().world_rank(), 3u);
    EXPECT_EQ(got.assign_shard().gloo().key_prefix(), "plan-3/");
  }
  std::optional<Envelope> loaded = slog.Last(Envelope::kLoaded);
  EXPECT_EQ(loaded->loaded().plan_version(), 3u);
  EXPECT_EQ(loaded->worker_id(), "w1");

  // A Step out and its StepResult back, through StepBatch conversion.
  Envelope step = ValidStep();
  ASSERT_TRUE(server.Send("w1", step).ok());
  ASSERT_TRUE(WaitUntil([&] { return clog.Count(Envelope::kStep) == 1; }, milliseconds(2000)));
  Envelope got_step;
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    got_step = clog.messages.back();
  }
  StatusOr<StepBatch> batch = StepBatchFromProto(got_step.step().batch());
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->token_ids, ValidBatch().token_ids);
  Envelope result = ValidStepResult();
  result.mutable_step_result()->set_micro_batch_id(got_step.step().micro_batch_id());
  ASSERT_TRUE(client.Send(result).ok());
  ASSERT_TRUE(
      WaitUntil([&] { return slog.Count(Envelope::kStepResult) == 1; }, milliseconds(2000)));
  EXPECT_EQ(slog.Last(Envelope::kStepResult)->step_result().micro_batch_id(), 9u);

  // Sends the codec refuses, or to nobody, fail at the call.
  EXPECT_EQ(server.Send("nobody", step).code(), StatusCode::kNotFound);
  Envelope bad = ValidStep();
  bad.mutable_step()->set_plan_version(0);
  EXPECT_EQ(server.Send("w1", bad).code(), StatusCode::kInvalidArgument);
  Envelope bad_result = ValidStepResult();
  bad_result.mutable_step_result()->mutable_tokens(0)->set_token_id(-1);
  EXPECT_EQ(client.Send(bad_result).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(slog.Drops(), 0u);
  EXPECT_EQ(clog.Drops(), 0u);
}

// The server decodes each frame onto an arena it resets after the frame
// (ControlServer::Impl::frame_arena): frames larger than its first block,
// and small ones after them, reach on_message whole and in order.
TEST(ControlPlane, FramesLargerThanTheDecodeArenaArriveWholeAndInOrder) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> endpoint = server.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(endpoint.ok());
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(*endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody(), "w1").ok());
  ASSERT_TRUE(client.WaitRegistered(milliseconds(3000)).ok());

  // A request's updates of `tokens` tokens, each with a `text_bytes` text
  // (long texts live outside a string's inline buffer).
  auto updates = [](int64_t request_id, int tokens, size_t text_bytes) {
    Envelope e;
    control::RequestUpdates* r = e.mutable_request_updates();
    r->set_plan_version(7);
    control::RequestUpdate* u = r->add_updates();
    u->set_request_id(request_id);
    for (int i = 0; i < tokens; ++i) {
      control::TokenUpdate* t = u->add_tokens();
      t->set_token_id(i);
      t->set_text(std::string(text_bytes, static_cast<char>('a' + i % 26)));
    }
    return e;
  };
  // 1 MiB and 2 MiB of text, around small frames.
  const std::vector<Envelope> sent = {updates(1, 4096, 256), updates(2, 3, 1),
                                      updates(3, 1024, 2048), updates(4, 1, 40)};
  for (const Envelope& e : sent) ASSERT_TRUE(client.Send(e).ok());
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kRequestUpdates) == sent.size(); },
                        milliseconds(5000)));
  std::lock_guard<std::mutex> lock(slog.mu);
  std::vector<Envelope> got;
  for (const auto& m : slog.messages)
    if (m.second.has_request_updates()) got.push_back(m.second);
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    SCOPED_TRACE("frame " + std::to_string(i));
    EXPECT_EQ(got[i].request_updates().SerializeAsString(),
              sent[i].request_updates().SerializeAsString());
  }
  EXPECT_TRUE(slog.drops.empty());
}

TEST(ControlPlane, ClientDropsBadMessagesAndRetriesRegister) {
  // A hand-driven ROUTER plays the coordinator.
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  auto recv = [&](milliseconds timeout) -> std::optional<std::pair<std::string, Envelope>> {
    zmq_pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    zmq::message_t id, payload;
    EXPECT_TRUE(router.recv(id, zmq::recv_flags::none));
    EXPECT_TRUE(router.recv(payload, zmq::recv_flags::none));
    StatusOr<Envelope> d = DecodeEnvelope(payload.to_string_view());
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return std::make_pair(id.to_string(), d.ok() ? *d : Envelope());
  };
  auto send = [&](const std::string& id, const std::string& bytes) {
    zmq::message_t mi(id.data(), id.size()), mp(bytes.data(), bytes.size());
    router.send(mi, zmq::send_flags::sndmore);
    router.send(mp, zmq::send_flags::none);
  };

  ClientLog clog;
  ControlClient client(ClientOptions(&clog));  // register_retry 100 ms
  ASSERT_TRUE(client.Connect(endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody(), "w1").ok());
  // The first Register goes unanswered; the client sends it again.
  auto first = recv(milliseconds(2000));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->first, client.routing_id());
  EXPECT_EQ(first->second.worker_id(), "w1");
  EXPECT_TRUE(first->second.has_register_worker());
  const Clock::time_point t0 = Clock::now();
  auto second = recv(milliseconds(2000));
  ASSERT_TRUE(second.has_value());
  EXPECT_TRUE(second->second.has_register_worker());
  EXPECT_GT(second->second.seq(), first->second.seq());
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - t0).count(), 0.05);

  const std::string id = client.routing_id();
  Envelope drain = Wrap("w1");
  drain.mutable_drain()->set_reason("before registration");
  send(id, Serialize(drain));  // arrives before the ack: dropped
  send(id, std::string(12, '\xff'));
  Envelope ack = ValidAck();
  ack.mutable_register_ack()->set_heartbeat_interval_ms(30);
  send(id, Serialize(ack));
  StatusOr<std::string> wid = client.WaitRegistered(milliseconds(2000));
  ASSERT_TRUE(wid.ok()) << wid.status().ToString();
  EXPECT_EQ(*wid, "w1");
  Envelope other = Wrap("w2");
  other.mutable_drain()->set_reason("not yours");
  send(id, Serialize(other));
  Envelope heartbeat = ValidHeartbeat("w1");  // a worker -> coordinator body
  send(id, Serialize(heartbeat));
  Envelope future = Wrap("w1");
  future.set_protocol_version(2);
  future.mutable_shutdown();
  send(id, Serialize(future));
  drain.mutable_drain()->set_reason("now");
  send(id, Serialize(drain));
  ASSERT_TRUE(WaitUntil([&] { return clog.Count(Envelope::kDrain) == 1; }, milliseconds(2000)));
  EXPECT_EQ(clog.Count(Envelope::kRegisterAck), 1u);
  EXPECT_EQ(clog.Count(Envelope::kShutdown), 0u);
  {
    std::lock_guard<std::mutex> lock(clog.mu);
    const std::vector<std::string> expect = {
        "drain arrived before this worker registered",
        "not a valid protobuf Envelope",
        "drain is addressed to worker 'w2', this is 'w1'",
        "heartbeat is not a message the coordinator sends",
        "protocol_version 2 is not supported",
    };
    ASSERT_EQ(clog.drops.size(), expect.size());
    for (size_t i = 0; i < expect.size(); ++i)
      EXPECT_NE(clog.drops[i].message().find(expect[i]), std::string::npos)
          << "drop " << i << ": " << clog.drops[i].ToString();
    EXPECT_EQ(clog.messages.back().drain().reason(), "now");
  }
  // Heartbeats flow at the interval the ack set, carrying the assigned id.
  int heartbeats = 0;
  while (heartbeats < 3) {
    auto m = recv(milliseconds(1000));
    ASSERT_TRUE(m.has_value());
    if (!m->second.has_heartbeat()) continue;  // a late Register retry
    EXPECT_EQ(m->second.worker_id(), "w1");
    EXPECT_EQ(m->second.heartbeat().state(), control::WORKER_STATE_IDLE);
    ++heartbeats;
  }
}

TEST(ControlPlane, WorkerStartedBeforeTheCoordinatorRegistersOnceItAppears) {
  // Find a free port by binding once, then release it.
  std::string endpoint;
  {
    ServerLog unused;
    ControlServer probe(ServerOptions(&unused, milliseconds(1000)));
    StatusOr<std::string> e = probe.Start("tcp://127.0.0.1:*");
    ASSERT_TRUE(e.ok());
    endpoint = *e;
  }
  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  ASSERT_TRUE(client.Connect(endpoint).ok());
  ASSERT_TRUE(client.Register(ValidRegisterBody()).ok());
  EXPECT_EQ(client.WaitRegistered(milliseconds(150)).status().code(),
            StatusCode::kDeadlineExceeded);
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(50)));
  StatusOr<std::string> bound = server.Start(endpoint);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  StatusOr<std::string> id = client.WaitRegistered(milliseconds(3000));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return slog.Count(Envelope::kHeartbeat) >= 2; }, milliseconds(2000)));
  EXPECT_EQ(server.Workers().size(), 1u);
}

TEST(ControlPlane, StartAndConnectReportBadEndpoints) {
  ServerLog slog;
  ControlServer server(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> bad = server.Start("nonsense://here");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kIoError);
  EXPECT_NE(bad.status().message().find("'nonsense://here'"), std::string::npos);
  ControlServer taken_a(ServerOptions(&slog, milliseconds(1000)));
  StatusOr<std::string> a = taken_a.Start("tcp://127.0.0.1:*");
  ASSERT_TRUE(a.ok());
  ControlServer taken_b(ServerOptions(&slog, milliseconds(1000)));
  EXPECT_EQ(taken_b.Start(*a).status().code(), StatusCode::kIoError);
  EXPECT_EQ(taken_a.Start("tcp://127.0.0.1:*").status().code(), StatusCode::kFailedPrecondition);
  ControlServer zero(ServerOptions(&slog, milliseconds(0)));
  EXPECT_EQ(zero.Start("tcp://127.0.0.1:*").status().code(), StatusCode::kInvalidArgument);

  ClientLog clog;
  ControlClient client(ClientOptions(&clog));
  Status c = client.Connect("tcp://");
  EXPECT_EQ(c.code(), StatusCode::kIoError) << c.ToString();
  ControlClient unconnected(ClientOptions(&clog));
  EXPECT_EQ(unconnected.Register(ValidRegisterBody()).code(), StatusCode::kFailedPrecondition);
  control::Register empty;
  ControlClient connected(ClientOptions(&clog));
  ASSERT_TRUE(connected.Connect(*a).ok());
  Status r = connected.Register(empty);
  EXPECT_EQ(r.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.message().find("register_worker: host is empty"), std::string::npos);
}

}  // namespace
}  // namespace tessera
