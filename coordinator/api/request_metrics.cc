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

struct Timing {
  Clock::time_point arrival;
  bool admitted = false;
  std::optional<Clock::time_point> last_token;
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
  auto t = std::make_shared<Timing>();
  t->arrival = arrival;
  RequestCallbacks out;
  out.on_prompt_logprobs = std::move(cb.on_prompt_logprobs);
  out.on_admit = [this, t, inner = std::move(cb.on_admit)] {
    if (!t->admitted) {
      t->admitted = true;
      queue_.Observe(Seconds(t->arrival, Clock::now()));
    }
    if (inner) inner();
  };
  out.on_token = [this, t, inner = std::move(cb.on_token)](const std::string& text, int32_t token,
                                                           const SampledToken* logprobs) {
    if (token >= 0) {  // -1: text flushed at the finish, no new token
      const auto now = Clock::now();
      if (!t->last_token) {
        ttft_.Observe(Seconds(t->arrival, now));
      } else {
        itl_.Observe(Seconds(*t->last_token, now));
      }
      t->last_token = now;
    }
    if (inner) inner(text, token, logprobs);
  };
  out.on_finish = [this, t, inner = std::move(cb.on_finish)](const GenerationResult& r) {
    e2e_.Observe(Seconds(t->arrival, Clock::now()));
    requests_.WithLabels({FinishReasonName(r.finish_reason)}).Inc();
    if (r.finish_reason == FinishReason::kError && r.error.code() == StatusCode::kDataLoss)
      nonfinite_.Inc();
    prompt_tokens_.Inc(static_cast<double>(r.prompt_tokens));
    generated_tokens_.Inc(static_cast<double>(r.tokens.size()));
    if (inner) inner(r);
  };
  return out;
}

void RequestMetrics::Rejected() { requests_.WithLabels({"rejected"}).Inc(); }

}  // namespace tessera
