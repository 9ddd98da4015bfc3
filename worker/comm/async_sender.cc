#include "worker/comm/async_sender.h"

#include <string>

namespace tessera {

Status SendFrame(Communicator& comm, int peer, const void* data, size_t bytes) {
  const uint64_t n = bytes;
  TESSERA_RETURN_IF_ERROR(comm.Send(&n, sizeof n, peer));
  if (bytes == 0) return Status::Ok();
  return comm.Send(data, bytes, peer);
}

Status RecvFrame(Communicator& comm, int peer, std::vector<uint8_t>& out, size_t max_bytes) {
  uint64_t n = 0;
  TESSERA_RETURN_IF_ERROR(comm.Recv(&n, sizeof n, peer));
  if (n > max_bytes)
    return InvalidArgument("frame of " + std::to_string(n) + " bytes from " + comm.name() +
                           " exceeds " + std::to_string(max_bytes));
  out.resize(n);
  if (n == 0) return Status::Ok();
  return comm.Recv(out.data(), n, peer);
}

AsyncSender::AsyncSender(Communicator* comm, int peer, size_t capacity)
    : AsyncSender(std::vector<Communicator*>{comm}, peer, capacity) {}

AsyncSender::AsyncSender(std::vector<Communicator*> comms, int peer, size_t capacity)
    : comms_(std::move(comms)), peer_(peer), capacity_(capacity), thread_([this] { Run(); }) {}

AsyncSender::~AsyncSender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status AsyncSender::Enqueue(std::vector<uint8_t> payload) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.size() < capacity_ || !error_.ok(); });
  if (!error_.ok()) return error_;
  if (comms_.empty()) return Status::Ok();  // this rank feeds nobody
  queue_.push_back(std::move(payload));
  cv_.notify_all();
  return Status::Ok();
}

Status AsyncSender::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return (queue_.empty() && !sending_) || !error_.ok(); });
  return error_;
}

void AsyncSender::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping with nothing left
    if (!error_.ok()) {
      queue_.clear();
      cv_.notify_all();
      continue;
    }
    std::vector<uint8_t> msg = std::move(queue_.front());
    queue_.pop_front();
    sending_ = true;
    lock.unlock();
    Status s;
    for (Communicator* comm : comms_) {
      s = SendFrame(*comm, peer_, msg.data(), msg.size());
      if (!s.ok()) break;
    }
    lock.lock();
    sending_ = false;
    if (!s.ok() && error_.ok()) error_ = s;
    cv_.notify_all();
  }
}

}  // namespace tessera
