#include "coordinator/api/request_metrics.h"

#include <memory>
#include <optional>

#include "common/metrics/metric_catalog.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One request's timing and its own callbacks: the instrumented closures
// hold only a shared_ptr to it, which std::function keeps without an
// allocation (a closure with more captures costs one each).
struct Timed {
  RequestMetrics* metrics = nullptr;
  Clock::time_point arrival;
  bool admitted = false;
  std::optional<Clock::time_point> last_token;
  RequestCallbacks inner;
};

}  // namespace

RequestMetrics::RequestMetrics(MetricsRegistry& r)
    : requests_(r.Counter(metric::kRequestsTotal)),
      nonfinite_(r.Counter(metric::kNonfiniteLogitsTotal).WithLabels({})),
      ttft_(r.Histogram(metric::kRequestTtftSeconds).WithLabels({})),
      itl_(r.Histogram(metric::kRequestInterTokenSeconds).WithLabels({})),
      e2e_(r.Histogram(metric::kRequestE2eSeconds).WithLabels({})),
      queue_(r.Histogram(metric::kRequestQueueSeconds).WithLabels({})),
      prompt_tokens_(r.Counter(metric::kPromptTokensTotal).WithLabels({})),
      generated_tokens_(r.Counter(metric::kGenerationTokensTotal).WithLabels({})),
      queue_depth_(r.Gauge(metric::kQueueDepth).WithLabels({})) {
  // Every status exists from the start, so rates and ratios have data.
  for (const char* s : {"length", "eos", "stop", "cancelled", "error", "rejected"})
    requests_.WithLabels({s});
}

RequestCallbacks RequestMetrics::Instrument(RequestCallbacks cb, Clock::time_point arrival) {
  auto t = std::make_shared<Timed>();
  t->metrics = this;
  t->arrival = arrival;
  RequestCallbacks out;
  out.on_prompt_logprobs = std::move(cb.on_prompt_logprobs);
  t->inner = std::move(cb);
  out.on_admit = [t] {
    if (!t->admitted) {
      t->admitted = true;
      t->metrics->queue_.Observe(Seconds(t->arrival, Clock::now()));
    }
    if (t->inner.on_admit) t->inner.on_admit();
  };
  out.on_token = [t](const std::string& text, int32_t token, const SampledToken* logprobs) {
    if (token >= 0) {  // -1: text flushed at the finish, no new token
      const auto now = Clock::now();
      if (!t->last_token) {
        t->metrics->ttft_.Observe(Seconds(t->arrival, now));
      } else {
        t->metrics->itl_.Observe(Seconds(*t->last_token, now));
      }
      t->last_token = now;
    }
    if (t->inner.on_token) t->inner.on_token(text, token, logprobs);
  };
  out.on_finish = [t](const GenerationResult& r) {
    RequestMetrics& m = *t->metrics;
    m.e2e_.Observe(Seconds(t->arrival, Clock::now()));
    m.requests_.WithLabels({FinishReasonName(r.finish_reason)}).Inc();
    if (r.finish_reason == FinishReason::kError && r.error.code() == StatusCode::kDataLoss)
      m.nonfinite_.Inc();
    m.prompt_tokens_.Inc(static_cast<double>(r.prompt_tokens));
    m.generated_tokens_.Inc(static_cast<double>(r.tokens.size()));
    if (t->inner.on_finish) t->inner.on_finish(r);
  };
  return out;
}

void RequestMetrics::Rejected() { requests_.WithLabels({"rejected"}).Inc(); }

}  // namespace tessera
