// RequestMetrics: per-request latency and outcome metrics of the coordinator
// (the request part of common/metrics/metric_catalog.h), recorded by wrapping a
// request's scheduler callbacks:
//   queue time   arrival -> first admission (RequestCallbacks::on_admit)
//   TTFT         arrival -> first generated token
//   inter-token  between consecutive generated tokens
//   e2e latency  arrival -> finish; requests_total{status}; prompt and
//                generated token counters; tessera_nonfinite_logits_total
//                for a request finished with kError / kDataLoss (the
//                sampling rank found NaN or inf logits)
//
// Thread-safety: Instrument and Rejected may be called from any thread; the
// wrapped callbacks run on the scheduler's owner thread, as the originals.
#pragma once

#include <chrono>

#include "common/engine/scheduler.h"
#include "common/metrics/metrics_registry.h"

namespace tessera {

class RequestMetrics {
 public:
  // `registry` holds the coordinator catalog (FromCatalog("coordinator")) and
  // must outlive this.
  explicit RequestMetrics(MetricsRegistry& registry);

  // `callbacks` with timing and outcome recording around them. `arrival` is
  // when the HTTP request arrived.
  RequestCallbacks Instrument(RequestCallbacks callbacks,
                              std::chrono::steady_clock::time_point arrival);
  // A request refused at admission (queue full, context too long, prompt or
  // stream limit).
  void Rejected();
  // HTTP generation requests accepted and not yet answered.
  Gauge& queue_depth() { return queue_depth_; }

 private:
  CounterFamily& requests_;
  Counter& nonfinite_;  // sequences failed with kDataLoss (non-finite logits)
  Histogram& ttft_;
  Histogram& itl_;
  Histogram& e2e_;
  Histogram& queue_;
  Counter& prompt_tokens_;
  Counter& generated_tokens_;
  Gauge& queue_depth_;
};

}  // namespace tessera
