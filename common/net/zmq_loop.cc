#include "common/net/zmq_loop.h"

#include <algorithm>
#include <cerrno>
#include <exception>
#include <utility>

#include "common/base/logging.h"

namespace tessera {

namespace {

std::string NewWakeEndpoint() {
  static std::atomic<uint64_t> next{0};
  return "inproc://tessera-zmq-loop-wake-" + std::to_string(next++);
}

}  // namespace

ZmqSocketLoop::ZmqSocketLoop(zmq::context_t& context, std::string log_name)
    : context_(context), log_name_(std::move(log_name)), wake_endpoint_(NewWakeEndpoint()) {}

ZmqSocketLoop::~ZmqSocketLoop() { Stop(); }

Status ZmqSocketLoop::Start(Hooks hooks) {
  if (started_) return FailedPrecondition(log_name_ + ": the socket loop starts once");
  if (!hooks.poll_timeout)
    return InvalidArgument(log_name_ + ": the socket loop needs poll_timeout");
  try {
    wake_reader_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
    wake_reader_->set(zmq::sockopt::linger, 0);
    wake_reader_->bind(wake_endpoint_);
    auto writer = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
    writer->set(zmq::sockopt::linger, 0);
    writer->connect(wake_endpoint_);
    std::lock_guard<std::mutex> lock(mu_);
    wake_writer_ = std::move(writer);
    accepting_ = true;
  } catch (const zmq::error_t& e) {
    wake_reader_.reset();
    return IoError(log_name_ + ": cannot open the wake pipe " + wake_endpoint_ + ": " + e.what());
  }
  hooks_ = std::move(hooks);
  started_ = true;
  running_ = true;
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

bool ZmqSocketLoop::Post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) return false;
  tasks_.push_back(std::move(task));
  WakeLocked();
  return true;
}

void ZmqSocketLoop::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  if (accepting_) WakeLocked();
}

void ZmqSocketLoop::WakeLocked() {
  if (wake_pending_ || !wake_writer_) return;
  wake_pending_ = true;
  try {
    wake_writer_->send(zmq::message_t(), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    // The loop runs its tasks every turn regardless; the wake-up only
    // shortens the wait.
    TESSERA_LOG_DEBUG(log_name_, "wake-up send failed: {}", e.what());
  }
}

void ZmqSocketLoop::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
    accepting_ = false;
    wake_pending_ = false;  // this wake-up goes out even if one is pending
    WakeLocked();
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  wake_writer_.reset();
  running_ = false;
}

void ZmqSocketLoop::Run() {
  while (!stop_requested_.load()) {
    try {
      Turn();
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      if (e.num() != EINTR) {
        TESSERA_LOG_ERROR(log_name_, "poll loop: ZeroMQ error: {}", e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // no busy error loop
      }
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR(log_name_, "poll loop: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // What was posted before Stop still runs (queued sends go out within the
  // socket's linger).
  RunTasks();
  try {
    if (hooks_.on_exit) hooks_.on_exit();
  } catch (const std::exception& e) {
    TESSERA_LOG_ERROR(log_name_, "closing: {}", e.what());
  }
  wake_reader_->close();
  TESSERA_LOG_INFO(log_name_, "stopped");
}

void ZmqSocketLoop::Turn() {
  std::vector<zmq_pollitem_t> items;
  std::vector<const Watch*> watched;
  items.reserve(hooks_.watches.size() + 1);
  items.push_back({wake_reader_->handle(), 0, ZMQ_POLLIN, 0});
  for (const Watch& w : hooks_.watches) {
    if (w.socket == nullptr) continue;
    items.push_back({w.socket->handle(), 0, ZMQ_POLLIN, 0});
    watched.push_back(&w);
  }
  const std::chrono::milliseconds timeout =
      std::max(hooks_.poll_timeout(), std::chrono::milliseconds(0));
  zmq::poll(items.data(), items.size(), timeout);
  if (items[0].revents & ZMQ_POLLIN) {
    zmq::message_t ignored;
    while (wake_reader_->recv(ignored, zmq::recv_flags::dontwait)) {
    }
  }
  for (size_t i = 0; i < watched.size(); ++i) {
    if ((items[i + 1].revents & ZMQ_POLLIN) && watched[i]->on_readable) watched[i]->on_readable();
  }
  if (hooks_.after_poll) hooks_.after_poll();
  RunTasks();
}

void ZmqSocketLoop::RunTasks() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(tasks_);
    wake_pending_ = false;
  }
  for (std::function<void()>& task : batch) {
    try {
      task();
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR(log_name_, "posted task threw: {}", e.what());
    }
  }
}

}  // namespace tessera
