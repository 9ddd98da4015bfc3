#include "common/engine/step_plan.h"

#include <chrono>

namespace tessera {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

StepOutcome ExecutePlan(StepExecutor& executor, const StepPlan& plan) {
  StepOutcome out;
  for (const PlannedBatch& b : plan.submit) {
    out.submit_times.push_back(SteadySeconds());
    Status st = executor.Submit(b.batch);
    if (!st.ok()) {
      out.submit_times.pop_back();
      out.submit_error = std::move(st);
      return out;
    }
    ++out.submitted;
  }
  if (plan.collect) out.collected = executor.Collect();
  return out;
}

}  // namespace tessera
