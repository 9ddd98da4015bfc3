// RequestSink: what the OpenAI frontend (coordinator/api/openai_frontend.h)
// sees of the serving path. It submits a request's prompts and cancels them;
// the serving loop (coordinator/serving/serving_loop.h) implements it.
//
// Thread-safety: every method is safe from any thread (the HTTP threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "common/engine/scheduler.h"

namespace tessera {

class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // Queues every prompt of one API request, or none (Scheduler::EnqueueAll):
  // `callbacks[i]` runs on the serving loop's thread for `requests[i]`.
  // Returns the request ids, in order. Errors: kResourceExhausted (the queue
  // is full), kInvalidArgument naming the field, kUnavailable (not serving).
  virtual StatusOr<std::vector<int64_t>> Submit(std::vector<GenerationRequest> requests,
                                                std::vector<RequestCallbacks> callbacks) = 0;
  // The requests `ids` finish with kCancelled at the loop's next iteration.
  virtual void Cancel(const std::vector<int64_t>& ids) = 0;
  // Requests queued / sequences running now (0 before serving starts).
  virtual size_t waiting() const = 0;
  virtual size_t running() const = 0;
};

}  // namespace tessera
