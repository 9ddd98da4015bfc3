// ZmqSocketLoop: the one owner thread of a ZeroMQ socket. ZeroMQ sockets are
// not thread-safe, so a component (the coordinator's ControlServer, the
// worker's ControlClient) hands its socket to one loop thread that polls it,
// runs the component's handlers when it is readable, runs the component's
// timers, and runs the work other threads post (sends) on that same thread.
// Other threads reach the socket only through Post, which queues a task and
// wakes the loop through an inproc PAIR socket (the wake pipe).
//
// Each turn of the loop: poll the watched sockets and the wake pipe for up
// to hooks.poll_timeout(); empty the wake pipe; call on_readable of each
// readable watched socket, in the order given; call after_poll (timers,
// liveness); run the posted tasks, in the order posted. An exception from a
// handler, hook or task is logged (under the loop's log name) and the loop
// goes on; a ZeroMQ error other than EINTR is logged and the loop backs off
// 10 ms before the next turn; ETERM ends it. On Stop the loop finishes its
// turn, runs the tasks posted before Stop (so queued sends still go out,
// within the socket's linger), calls on_exit (close the sockets there) and
// ends.
//
// Threading: Start, Stop and the destructor from the controlling thread
// (never from a handler or task). Post, Wake, stopping() and running() from
// any thread, handlers and tasks included. Handlers, hooks and tasks run on
// the owner thread, one at a time, and must not block for long. ZeroMQ
// exceptions never leave this class.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/base/status.h"

namespace tessera {

class ZmqSocketLoop {
 public:
  // A socket the loop polls for input, and what to do when it has some
  // (read what is there, without blocking).
  struct Watch {
    zmq::socket_t* socket = nullptr;  // owned by the component; null entries are skipped
    std::function<void()> on_readable;
  };
  struct Hooks {
    std::vector<Watch> watches;
    // The longest wait of the next poll (>= 0 ms; the loop clamps
    // negatives to 0). Called each turn on the owner thread. Required.
    std::function<std::chrono::milliseconds()> poll_timeout;
    // Each turn after the readable handlers: timers, liveness. Optional.
    std::function<void()> after_poll;
    // Once, on the owner thread, after the last tasks ran: close the
    // component's sockets here. Optional.
    std::function<void()> on_exit;
  };

  // `context` must outlive this object; `log_name` is the log component
  // errors are logged under ("control-server").
  ZmqSocketLoop(zmq::context_t& context, std::string log_name);
  // Stops the loop (see Stop).
  ~ZmqSocketLoop();

  ZmqSocketLoop(const ZmqSocketLoop&) = delete;
  ZmqSocketLoop& operator=(const ZmqSocketLoop&) = delete;

  // Creates the wake pipe and starts the owner thread, which from then on
  // owns the watched sockets. Once per object.
  // Errors: kFailedPrecondition (started before), kInvalidArgument (no
  // poll_timeout hook), kIoError (ZeroMQ refused the wake pipe).
  Status Start(Hooks hooks);

  // Queues `task` to run on the owner thread and wakes it. Returns false,
  // dropping the task, before Start and once Stop began.
  bool Post(std::function<void()> task);

  // Wakes the loop for a turn without a task (a timer the component moved
  // earlier). A no-op before Start and after Stop.
  void Wake();

  // Ends the loop: it finishes its turn, runs the tasks already posted,
  // calls on_exit, and the thread is joined. Idempotent.
  void Stop();

  // True once Stop began: handlers reading in a loop stop early.
  bool stopping() const { return stop_requested_.load(); }
  // True between Start and the end of Stop.
  bool running() const { return running_.load(); }

 private:
  void Run();
  void Turn();
  void RunTasks();
  void WakeLocked();  // caller holds mu_

  zmq::context_t& context_;
  const std::string log_name_;
  const std::string wake_endpoint_;             // unique per loop object
  Hooks hooks_;                                 // owner thread, after Start
  std::unique_ptr<zmq::socket_t> wake_reader_;  // owner thread, after Start
  std::thread thread_;
  bool started_ = false;  // controlling thread
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> running_{false};

  // The task queue and the writing end of the wake pipe.
  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;     // guarded by mu_
  std::unique_ptr<zmq::socket_t> wake_writer_;  // guarded by mu_
  bool wake_pending_ = false;                   // guarded by mu_: a wake-up is in the pipe
  bool accepting_ = false;                      // guarded by mu_: Post queues
};

}  // namespace tessera
