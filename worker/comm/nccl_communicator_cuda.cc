#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "kernels/cuda_context.h"
#include "worker/comm/nccl_communicator.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DType d) {
  switch (d) {
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
    default:
      return ncclFloat32;
  }
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclCommunicatorOptions& o, kernels::cuda::Context* ctx)
      : o_(o), ctx_(ctx) {}

  ~NcclCommunicator() override {
    // Let the watchdog see every enqueued operation finish (or time out and
    // abort), then stop it. ncclCommDestroy is local (no peer handshake),
    // unlike ncclCommFinalize, so a dead peer cannot hang the destructor.
    if (comm_ != nullptr) (void)WaitIdle("destroy");
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_ != nullptr && !aborted_) {
      if (failed_.load())
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (auto& p : pending_) cudaEventDestroy(p.event);
    if (dummy_) cudaFree(dummy_);
  }

  Status Init(Store& store) {
    const std::string key =
        (o_.key_prefix.empty() ? "" : o_.key_prefix + "/") + o_.group + "/nccl_unique_id";
    ncclUniqueId id;
    if (o_.rank == 0) {
      TESSERA_RETURN_IF_ERROR(Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", "init"));
      TESSERA_RETURN_IF_ERROR(
          store.Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id)));
    } else {
      auto v = store.Get(key, o_.connect_timeout_seconds);
      if (!v.ok())
        return v.status().WithContext(Who("init") + ": waiting for the NCCL unique id from rank 0");
      if (v->size() != sizeof id)
        return InvalidArgument(Who("init") + ": store key '" + key + "' holds " +
                               std::to_string(v->size()) + " bytes, not an NCCL unique id");
      std::memcpy(&id, v->data(), sizeof id);
    }
    // A blocking communicator: collectives return as soon as their kernels
    // are launched (a non-blocking one makes every call wait for NCCL's
    // proxy thread, ~80 us measured on H200s). Connections are made during
    // init (NCCL_RUNTIME_CONNECT=0), so no collective blocks on the host; a
    // hung one is left to the watchdog. Init runs on a helper thread so that
    // a rank that never arrives bounds it by connect_timeout_seconds.
    struct InitState {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      ncclResult_t result = ncclSuccess;
      ncclComm_t comm = nullptr;
    };
    auto state = std::make_shared<InitState>();
    const int device = ctx_->device(), size = o_.size, rank = o_.rank;
    std::thread([state, id, device, size, rank] {
      cudaSetDevice(device);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      ncclComm_t comm = nullptr;
      const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
      std::lock_guard<std::mutex> lock(state->mu);
      state->done = true;
      state->result = r;
      state->comm = comm;
      state->cv.notify_all();
    }).detach();
    {
      std::unique_lock<std::mutex> lock(state->mu);
      if (!state->cv.wait_for(lock, std::chrono::duration<double>(o_.connect_timeout_seconds),
                              [&] { return state->done; }))
        return DeadlineExceeded(Who("init") + ": ncclCommInitRankConfig did not complete within " +
                                Seconds(o_.connect_timeout_seconds) +
                                " (a rank of the group did not join)");
      comm_ = state->comm;
      if (state->result != ncclSuccess)
        return Nccl(state->result, "ncclCommInitRankConfig", "init");
    }
    TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(&dummy_, sizeof(float)));
    watchdog_ = std::thread([this] { Watch(); });
    return Status::Ok();
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  const std::string& name() const override { return o_.group; }
  Device device() const override { return Device::kCUDA; }

  Status AllReduceSum(float* data, size_t count) override {
    return AllReduceSumTyped(data, count, DType::kF32);
  }
  Status AllReduceSumTyped(void* data, size_t count, DType dtype) override {
    TESSERA_RETURN_IF_ERROR(Usable("all_reduce"));
    if (o_.size == 1 || count == 0) return Status::Ok();
    return Run("all_reduce", "ncclAllReduce", [&] {
      return ncclAllReduce(data, data, count, NcclType(dtype), ncclSum, comm_, ctx_->stream());
    });
  }
  Status AllGather(const float* send, size_t count_per_rank, float* recv) override {
    return AllGatherTyped(send, count_per_rank, DType::kF32, recv);
  }
  Status AllGatherTyped(const void* send, size_t count_per_rank, DType dtype, void* recv) override {
    TESSERA_RETURN_IF_ERROR(Usable("all_gather"));
    if (count_per_rank == 0) return Status::Ok();
    if (o_.size == 1) {
      if (send != recv)
        TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recv, send, count_per_rank * DTypeSize(dtype),
                                                     cudaMemcpyDeviceToDevice, ctx_->stream()));
      return Status::Ok();
    }
    return Run("all_gather", "ncclAllGather", [&] {
      return ncclAllGather(send, recv, count_per_rank, NcclType(dtype), comm_, ctx_->stream());
    });
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    TESSERA_RETURN_IF_ERROR(Usable("broadcast"));
    if (root < 0 || root >= o_.size)
      return InvalidArgument(Who("broadcast") + ": root " + std::to_string(root) +
                             " outside the group");
    if (o_.size == 1 || bytes == 0) return Status::Ok();
    return Run("broadcast", "ncclBroadcast", [&] {
      return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, ctx_->stream());
    });
  }
  Status Send(const void* data, size_t bytes, int peer) override {
    TESSERA_RETURN_IF_ERROR(Usable("send"));
    TESSERA_RETURN_IF_ERROR(CheckPeer("send", peer));
    return Run("send to rank " + std::to_string(peer), "ncclSend",
               [&] { return ncclSend(data, bytes, ncclUint8, peer, comm_, ctx_->stream()); });
  }
  Status Recv(void* data, size_t bytes, int peer) override {
    TESSERA_RETURN_IF_ERROR(Usable("recv"));
    TESSERA_RETURN_IF_ERROR(CheckPeer("recv", peer));
    return Run("recv from rank " + std::to_string(peer), "ncclRecv",
               [&] { return ncclRecv(data, bytes, ncclUint8, peer, comm_, ctx_->stream()); });
  }
  Status WatchEnqueued(const std::string& what) override {
    TESSERA_RETURN_IF_ERROR(Usable(what.c_str()));
    return Track(what, "cudaEventRecord");
  }
  Status Barrier() override {
    TESSERA_RETURN_IF_ERROR(Usable("barrier"));
    if (o_.size == 1) return Status::Ok();
    TESSERA_RETURN_IF_ERROR(Run("barrier", "ncclAllReduce", [&] {
      return ncclAllReduce(dummy_, dummy_, 1, ncclFloat32, ncclSum, comm_, ctx_->stream());
    }));
    return WaitIdle("barrier");
  }

 private:
  struct Pending {
    cudaEvent_t event;
    Clock::time_point deadline;
    std::string op;
  };

  std::string Who(const std::string& op) const {
    return op + " on rank " + std::to_string(o_.rank) + " of group " + o_.group;
  }

  Status CheckPeer(const char* op, int peer) const {
    if (peer < 0 || peer >= o_.size || peer == o_.rank)
      return InvalidArgument(Who(op) + ": peer " + std::to_string(peer) +
                             " is not another rank of the group");
    return Status::Ok();
  }

  Status Nccl(ncclResult_t r, const char* call, const std::string& op) const {
    if (r == ncclSuccess) return Status::Ok();
    std::string msg = Who(op) + ": " + call + " failed: " + ncclGetErrorString(r);
    if (comm_ != nullptr) {
      const char* last = ncclGetLastError(comm_);
      if (last != nullptr && *last) msg += " (" + std::string(last) + ")";
    }
    if (r == ncclRemoteError || r == ncclSystemError) return Unavailable(msg);
    return Internal(msg);
  }

  Status Usable(const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load())
      return FailedPrecondition(Who(op) +
                                ": the communicator failed earlier: " + first_failure_.message());
    return Status::Ok();
  }

  // Polls the communicator state until it leaves ncclInProgress.
  Status WaitNotInProgress(double timeout) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout);
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return Nccl(r, "ncclCommGetAsyncError", "wait");
      if (state == ncclSuccess) return Status::Ok();
      if (state != ncclInProgress) return Nccl(state, "ncclCommGetAsyncError", "wait");
      const auto now = Clock::now();
      if (now > deadline)
        return DeadlineExceeded(Who("wait") + ": not ready after " + Seconds(timeout));
      // Enqueueing usually finishes within microseconds: spin first, then back off.
      if (now - start < std::chrono::milliseconds(2))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void Fail(const Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.load()) return;
      first_failure_ = s;
      failed_.store(true);
    }
    ncclCommAbort(comm_);  // frees the communicator: never touched again
    aborted_ = true;
  }

  template <typename F>
  Status Run(const std::string& op, const char* call, F&& enqueue) {
    ncclResult_t r = enqueue();
    if (r == ncclInProgress) {
      Status s = WaitNotInProgress(o_.timeout_seconds);
      if (!s.ok()) {
        Status f = DeadlineExceeded(Who(op) + ": " + call + " was not enqueued within " +
                                    Seconds(o_.timeout_seconds) +
                                    " (ncclCommAbort called): " + s.message());
        Fail(f);
        return f;
      }
    } else if (r != ncclSuccess) {
      Status f = Nccl(r, call, op);
      Fail(f);
      return f;
    }
    return Track(op, call);
  }

  // Watches the stream up to here: an event the watchdog polls until it
  // completes or the timeout passes. Skipped while the stream is recording
  // a CUDA graph (the replay is watched instead, see WatchEnqueued).
  Status Track(const std::string& op, const char* call) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx_->stream(), &capturing) == cudaSuccess &&
        capturing != cudaStreamCaptureStatusNone)
      return Status::Ok();
    cudaEvent_t ev = TakeEvent();
    if (ev == nullptr || cudaEventRecord(ev, ctx_->stream()) != cudaSuccess) {
      Status f = Internal(Who(op) + ": cudaEventRecord after " + call + " failed");
      Fail(f);
      return f;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({ev,
                          Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o_.timeout_seconds)),
                          op});
    }
    cv_.notify_all();
    if (o_.blocking) return WaitIdle(op);
    return Status::Ok();
  }

  // Blocks until the watchdog has seen every enqueued operation complete, or
  // the communicator failed.
  Status WaitIdle(const std::string& op) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_.empty() || failed_.load(); });
    if (failed_.load())
      return Status(first_failure_.code(), first_failure_.message()).WithContext(Who(op));
    return Status::Ok();
  }

  cudaEvent_t TakeEvent() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return nullptr;
    return e;
  }

  void Watch() {
    cudaSetDevice(ctx_->device());
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (pending_.empty() || failed_.load()) {
        cv_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      Pending front = pending_.front();
      lock.unlock();
      const cudaError_t q = cudaEventQuery(front.event);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      Status failure;
      if (async != ncclSuccess && async != ncclInProgress) {
        failure =
            Nccl(async, "ncclCommGetAsyncError", front.op).WithContext("ncclCommAbort called");
      } else if (q == cudaErrorNotReady && Clock::now() > front.deadline) {
        failure = DeadlineExceeded(Who(front.op) + ": timed out after " +
                                   Seconds(o_.timeout_seconds) + " (ncclCommAbort called)");
      } else if (q != cudaSuccess && q != cudaErrorNotReady) {
        failure = kernels::cuda::CudaError(q, "cudaEventQuery", __FILE__, __LINE__)
                      .WithContext(Who(front.op));
      }
      if (!failure.ok()) Fail(failure);
      lock.lock();
      if (q == cudaSuccess) {
        pending_.pop_front();
        free_events_.push_back(front.event);
        if (pending_.empty()) cv_.notify_all();
        continue;
      }
      if (failed_.load()) {
        cv_.notify_all();
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
    }
  }

  const NcclCommunicatorOptions o_;
  kernels::cuda::Context* ctx_;
  ncclComm_t comm_ = nullptr;
  void* dummy_ = nullptr;
  std::thread watchdog_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;           // guarded by mu_
  std::vector<cudaEvent_t> free_events_;  // guarded by mu_
  bool stop_ = false;                     // guarded by mu_
  std::atomic<bool> failed_{false};
  bool aborted_ = false;  // set once by Fail, read by the destructor after the watchdog joined
  Status first_failure_;  // guarded by mu_
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    Store& store, const NcclCommunicatorOptions& options, kernels::Backend& backend) {
  if (backend.device() != Device::kCUDA)
    return InvalidArgument("nccl group " + options.group + ": backend " + backend.name() +
                           " is not a CUDA backend");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size)
    return InvalidArgument("nccl group " + options.group + ": rank " +
                           std::to_string(options.rank) + " of size " +
                           std::to_string(options.size));
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  TESSERA_RETURN_IF_ERROR(kernels::MakeCurrent(backend));
  TESSERA_ASSIGN_OR_RETURN(kernels::cuda::Context * ctx, kernels::cuda::Current());
  auto comm = std::make_unique<NcclCommunicator>(options, ctx);
  TESSERA_RETURN_IF_ERROR(comm->Init(store));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace tessera
