// EpollShardLoop: the one owner thread of many ZeroMQ sockets (a fleet
// simulator shard's hundreds of DEALERs), waiting in epoll on each socket's
// ZMQ_FD, so a turn costs what its ready sockets cost. (zmq_poll, which
// common/net/zmq_loop.h uses for a daemon's one or two sockets, asks every
// socket for ZMQ_EVENTS every turn: at 256 sockets a thread that is most of
// the simulator's CPU.)
//
// ZMQ_FD is edge-triggered (zmq_getsockopt(3), ZMQ_FD): it becomes readable
// when the socket's command mailbox gets a command, which may or may not
// mean input, and any call on the socket (recv, send, ZMQ_EVENTS) may take
// that command and clear the fd while input stays queued. So, on the owner
// thread:
//  - a socket whose fd woke is checked: while ZMQ_EVENTS says ZMQ_POLLIN,
//    on_readable(i) runs, which reads with ZMQ_DONTWAIT until EAGAIN (true)
//    or a cap (false: checked again next turn, after the other sockets);
//  - a socket the component sent on is checked too (Touched(i) after each
//    send), since the send may have taken the edge of input that arrived
//    meanwhile. A send inside socket i's own on_readable needs nothing: the
//    handler's final EAGAIN took every command after it.
//
// Each turn: wait in epoll_wait until the component's next timer
// (hooks.next_due; at most 100 ms, none when a socket is still to check);
// check the sockets that woke or were touched, in that order; run the
// component's timers (hooks.run_due); run the tasks other threads posted,
// in the order posted. An exception from a handler, hook or task is logged
// and the loop goes on. On Stop the loop finishes its turn, runs the tasks
// posted before Stop, calls on_exit (close the sockets there) and ends.
//
// Threading: Start, Stop and the destructor from the controlling thread.
// Post from any thread. Touched and the hooks on the owner thread only; the
// sockets belong to the owner thread from Start on. ZeroMQ exceptions never
// leave this class.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/base/status.h"

namespace tessera::fleet_sim {

class EpollShardLoop {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hooks {
    // The sockets, owned by the component; socket i is checked with
    // on_readable(i). None may be null.
    std::vector<zmq::socket_t*> sockets;
    // Reads socket i with ZMQ_DONTWAIT; true when it stopped at EAGAIN,
    // false when it stopped early (a cap, a closed socket). Required.
    std::function<bool(size_t)> on_readable;
    // When the next timer is due (Clock::time_point::max(): none). Required.
    std::function<Clock::time_point()> next_due;
    // Runs the timers that are due. Required.
    std::function<void()> run_due;
    // Once, on the owner thread, after the last tasks ran. Optional.
    std::function<void()> on_exit;
  };

  // `thread_name` names the owner thread (the first 15 bytes: per-thread
  // CPU in /proc/<pid>/task/*/comm) and the log lines.
  explicit EpollShardLoop(std::string thread_name);
  ~EpollShardLoop();
  EpollShardLoop(const EpollShardLoop&) = delete;
  EpollShardLoop& operator=(const EpollShardLoop&) = delete;

  // Registers every socket's ZMQ_FD and a wake eventfd with a new epoll
  // instance and starts the owner thread. Once per object.
  // Errors: kFailedPrecondition (started before), kInvalidArgument (a
  // missing hook or a null socket), kIoError (epoll, eventfd or ZMQ_FD
  // refused, with errno's text).
  Status Start(Hooks hooks);

  // Queues `task` for the owner thread and wakes it. False (the task
  // dropped) before Start and once Stop began.
  bool Post(std::function<void()> task);

  // Owner thread: socket i was sent on; check it for input this turn or
  // the next.
  void Touched(size_t i);

  // Ends the loop (see above) and joins the thread. Idempotent.
  void Stop();

 private:
  void Run();
  void Turn();
  int WaitMs() const;
  void Check(size_t i);
  void RunTasks();

  const std::string name_;
  Hooks hooks_;        // owner thread, after Start
  int epoll_fd_ = -1;  // closed by Stop after the join
  int wake_fd_ = -1;   // eventfd; written by Post, read by the owner thread
  std::thread thread_;
  bool started_ = false;  // controlling thread
  std::atomic<bool> stop_requested_{false};

  // Owner thread: the sockets to check, and which are listed (each once).
  std::vector<size_t> to_check_;
  std::vector<size_t> checking_;  // this turn's
  std::vector<uint8_t> listed_;
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t reading_ = kNone;  // the socket whose on_readable runs

  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool accepting_ = false;                   // guarded by mu_
  bool wake_pending_ = false;                // guarded by mu_: the eventfd was written
};

}  // namespace tessera::fleet_sim
