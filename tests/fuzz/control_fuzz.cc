// libFuzzer harness: the control-plane message handlers.
//
// Input: frames as [u16 little-endian length][bytes]... Each frame is
//  1. decoded in memory like every received frame (DecodeEnvelope, which
//     validates), and an accepted one is taken apart as the worker does
//     (StepBatchFromProto, ErrorToStatus) and must encode again;
//  2. sent as it is over a real ZeroMQ DEALER to a running ControlServer
//     (the coordinator's ROUTER), whose owner thread decodes it and
//     dispatches it (registration, heartbeats, results, drops). The server
//     must have read every frame and must keep running.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/wire/control_codec.h"
#include "coordinator/control/control_server.h"
#include "fuzz_util.h"

namespace {

using namespace tessera;

struct Live {
  ControlServer server{Options()};
  zmq::context_t context{1};
  zmq::socket_t dealer{context, zmq::socket_type::dealer};

  static ControlServerOptions Options() {
    ControlServerOptions o;
    o.heartbeat_interval = std::chrono::milliseconds(1000);
    o.heartbeat_miss_limit = 1000;
    o.on_message = [](const ControlPeer&, const control::Envelope& e) {
      if (e.has_step_result()) (void)e.step_result().tokens_size();
    };
    return o;
  }

  Live() {
    auto endpoint = server.Start("tcp://127.0.0.1:*");
    if (!endpoint.ok()) fuzz::Fail("control server: " + endpoint.status().ToString());
    dealer.set(zmq::sockopt::routing_id, std::string("fuzz-peer"));
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(*endpoint);
  }
};

Live& TheLive() {
  static Live* live = new Live();  // lives for the whole process
  return *live;
}

void InMemory(std::string_view bytes) {
  auto decoded = DecodeEnvelope(bytes);
  if (!decoded.ok()) return;
  const control::Envelope& e = *decoded;
  (void)EnvelopeBodyName(e);
  if (e.has_step()) (void)StepBatchFromProto(e.step().batch());
  if (e.has_error()) (void)ErrorToStatus(e.error());
  if (e.has_step_result() && e.step_result().has_error())
    (void)ErrorToStatus(e.step_result().error());
  auto encoded = EncodeEnvelope(e);
  if (!encoded.ok())
    fuzz::Fail("a decoded envelope does not encode again: " + encoded.status().ToString());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Live& live = TheLive();
  const uint64_t before = live.server.stats().frames_received;
  uint64_t sent = 0;
  fuzz::ForEachFrame(data, size, [&](std::string_view frame) {
    InMemory(frame);
    if (live.dealer.send(zmq::buffer(frame.data(), frame.size()), zmq::send_flags::none)) ++sent;
  });
  // Wait until the server's thread has handled every frame.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (live.server.stats().frames_received < before + sent) {
    if (std::chrono::steady_clock::now() > deadline)
      fuzz::Fail("the control server stopped reading frames");
    std::this_thread::yield();
  }
  return 0;
}
