#include "worker/daemon/worker_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/metrics/metric_catalog.h"
#include "common/wire/step_codec.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t ProcessRssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t HostMemTotalBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemTotal:") return kb * 1024;
  return 0;
}

double ProcessCpuSeconds() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

const char* StepPhase(const StepBatch& batch) {
  for (const SeqStep& s : batch.seqs)
    if (s.start_pos < s.prompt_len || s.num_tokens > 1) return "prefill";
  return "decode";
}

// ---------------------------------------------------------------------------
// StageClock

StageClock::StageClock(Counter& busy, Counter& idle, Gauge& bubble, double window_seconds)
    : busy_(busy),
      idle_(idle),
      bubble_(bubble),
      window_seconds_(window_seconds),
      since_(Clock::now()),
      window_start_(since_) {}

void StageClock::Switch(State next) {
  const auto now = Clock::now();
  const double dt = Seconds(since_, now);
  if (state_ == State::kBusy) {
    busy_.Inc(dt);
    window_busy_ += dt;
  } else if (state_ == State::kIdle) {
    idle_.Inc(dt);
    window_idle_ += dt;
  }
  since_ = now;
  state_ = next;
  const double total = window_busy_ + window_idle_;
  if (total > 0) bubble_.Set(window_idle_ / total);
  if (Seconds(window_start_, now) >= window_seconds_) {
    window_start_ = now;
    window_busy_ = window_idle_ = 0;
  }
}

void StageClock::Busy() {
  std::lock_guard<std::mutex> lock(mu_);
  Switch(State::kBusy);
}

void StageClock::Idle() {
  std::lock_guard<std::mutex> lock(mu_);
  Switch(State::kIdle);
}

void StageClock::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  Switch(state_);
}

// ---------------------------------------------------------------------------
// WorkerMetrics

struct WorkerMetrics::PrevLinkState {
  bool expect_payload = false;  // the last Recv was a frame's length
  bool expect_hidden = false;   // the last payload was a step frame
  bool in_step = false;
  Clock::time_point step_start;
  StepBatch batch;
};

StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(MetricsRegistry* registry,
                                                               std::string node, int device,
                                                               std::unique_ptr<NvmlProbe> nvml) {
  TESSERA_RETURN_IF_ERROR(registry->FromCatalog("worker"));
  std::unique_ptr<WorkerMetrics> m(
      new WorkerMetrics(registry, std::move(node), device, std::move(nvml)));
  WorkerMetrics* raw = m.get();
  registry->AddCollectHook([raw] { raw->Collect(); });
  return m;
}

WorkerMetrics::WorkerMetrics(MetricsRegistry* registry, std::string node, int device,
                             std::unique_ptr<NvmlProbe> nvml)
    : registry_(registry), node_(std::move(node)), device_(device), nvml_(std::move(nvml)) {
  uuid_ = "cpu";
  if (nvml_) {
    auto info = nvml_->Device(device_);
    if (info.ok() && !info->uuid.empty()) uuid_ = info->uuid;
  }
  last_sample_ = Clock::now();
}

WorkerMetrics::~WorkerMetrics() = default;

std::vector<std::string> WorkerMetrics::Labels() const {
  return {std::to_string(replica_), node_, std::to_string(device_), uuid_, std::to_string(stage_),
          std::to_string(tp_rank_)};
}

void WorkerMetrics::SetWorker(const std::string& worker_id, const std::string& version) {
  registry_->Gauge(metric::kWorkerInfo)
      .WithLabels(
          {node_, std::to_string(device_), uuid_, worker_id, nvml_ ? "cuda" : "cpu", version})
      .Set(1);
}

void WorkerMetrics::SetRank(int replica, int stage, int tp_rank, uint64_t plan_version) {
  std::lock_guard<std::mutex> lock(mu_);
  replica_ = replica;
  stage_ = stage;
  tp_rank_ = tp_rank;
  has_rank_ = true;
  const auto l = Labels();
  registry_->Gauge(metric::kWorkerPlanVersion).WithLabels(l).Set(static_cast<double>(plan_version));
  // Every phase starts at zero, so rate() and histogram_quantile() see both.
  for (const char* phase : {"prefill", "decode"}) {
    auto lp = l;
    lp.push_back(phase);
    registry_->Histogram(metric::kStepDurationSeconds).WithLabels(lp);
    registry_->Counter(metric::kStepTokensTotal).WithLabels(lp);
  }
  clock_ =
      std::make_unique<StageClock>(registry_->Counter(metric::kStageBusySecondsTotal).WithLabels(l),
                                   registry_->Counter(metric::kStageIdleSecondsTotal).WithLabels(l),
                                   registry_->Gauge(metric::kPipelineBubbleRatio).WithLabels(l));
}

void WorkerMetrics::OnLoadProgress(int64_t bytes_done, int64_t bytes_total) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!has_rank_) return;
  const auto l = Labels();
  registry_->Gauge(metric::kWorkerLoadBytes).WithLabels(l).Set(static_cast<double>(bytes_done));
  registry_->Gauge(metric::kWorkerLoadTotalBytes)
      .WithLabels(l)
      .Set(static_cast<double>(bytes_total));
}

void WorkerMetrics::OnLoaded(int64_t weight_bytes, int64_t kv_capacity_bytes, double load_seconds,
                             int64_t quantized_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  weight_bytes_ = weight_bytes;
  kv_bytes_ = kv_capacity_bytes;
  if (!has_rank_) return;
  const auto l = Labels();
  registry_->Gauge(metric::kGpuWeightBytes).WithLabels(l).Set(static_cast<double>(weight_bytes));
  registry_->Gauge(metric::kGpuWeightQuantizedBytes)
      .WithLabels(l)
      .Set(static_cast<double>(quantized_bytes));
  registry_->Gauge(metric::kGpuKvCacheCapacityBytes)
      .WithLabels(l)
      .Set(static_cast<double>(kv_capacity_bytes));
  registry_->Gauge(metric::kWorkerLoadSeconds).WithLabels(l).Set(load_seconds);
}

void WorkerMetrics::SetMoeCounts(std::shared_ptr<const MoeTokenCounts> counts) {
  std::lock_guard<std::mutex> lock(mu_);
  moe_counts_ = std::move(counts);
  moe_exported_.assign(
      moe_counts_ ? static_cast<size_t>(moe_counts_->expert_end() - moe_counts_->expert_begin())
                  : 0,
      0);
}

void WorkerMetrics::ObserveStep(const StepBatch& batch, double seconds) {
  std::vector<std::string> l;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!has_rank_) return;
    l = Labels();
  }
  l.push_back(StepPhase(batch));
  registry_->Histogram(metric::kStepDurationSeconds).WithLabels(l).Observe(seconds);
  registry_->Counter(metric::kStepTokensTotal)
      .WithLabels(l)
      .Inc(static_cast<double>(batch.total_tokens()));
}

Communicator* WorkerMetrics::Wrap(Communicator* inner) {
  if (!inner) return nullptr;
  std::vector<std::string> l;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TESSERA_CHECK(has_rank_);
    l = Labels();
  }
  wrapped_.push_back(std::make_unique<MeteredCommunicator>(
      inner, registry_->Histogram(metric::kCommDurationSeconds),
      registry_->Counter(metric::kCommBytesTotal), l));
  return wrapped_.back().get();
}

Communicator* WorkerMetrics::WrapPrevLink(Communicator* inner) {
  if (!inner) return nullptr;
  std::vector<std::string> l;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TESSERA_CHECK(has_rank_ && clock_);
    l = Labels();
  }
  prev_ = std::make_unique<PrevLinkState>();
  RecvHooks hooks;
  hooks.before = [this] {
    PrevLinkState& p = *prev_;
    if (p.in_step) {
      ObserveStep(p.batch, Seconds(p.step_start, Clock::now()));
      p.in_step = false;
    }
    clock_->Idle();
  };
  hooks.after = [this](const void* data, size_t bytes) {
    PrevLinkState& p = *prev_;
    if (!p.expect_payload) {
      // A frame's u64 length; a zero-length frame has no payload Recv.
      uint64_t n = 0;
      if (bytes == sizeof n) std::memcpy(&n, data, sizeof n);
      p.expect_payload = n > 0;
      return;
    }
    p.expect_payload = false;
    if (p.expect_hidden) {  // the hidden states: the stage now runs the step
      p.expect_hidden = false;
      p.in_step = true;
      p.step_start = Clock::now();
      clock_->Busy();
      return;
    }
    const auto* b = static_cast<const uint8_t*>(data);
    auto step = DecodeStep(std::vector<uint8_t>(b, b + bytes));
    if (step.ok() && step->kind == StepMessageKind::kStep) {
      p.batch = std::move(step->batch);
      p.expect_hidden = true;
    }
  };
  wrapped_.push_back(std::make_unique<MeteredCommunicator>(
      inner, registry_->Histogram(metric::kCommDurationSeconds),
      registry_->Counter(metric::kCommBytesTotal), l, std::move(hooks)));
  return wrapped_.back().get();
}

void WorkerMetrics::Collect() {
  int64_t used = 0, total = 0;
  double util = -1;
  if (nvml_) {
    std::lock_guard<std::mutex> lock(nvml_mu_);
    auto u = nvml_->CurrentUsage(device_);
    if (u.ok()) {
      used = u->used_bytes;
      total = u->total_bytes;
      util = u->utilization;
    }
  } else {
    used = ProcessRssBytes();
    total = HostMemTotalBytes();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!nvml_) {
    const auto now = Clock::now();
    const double cpu = ProcessCpuSeconds();
    const double wall = Seconds(last_sample_, now);
    if (last_cpu_seconds_ >= 0 && wall > 0) util = (cpu - last_cpu_seconds_) / wall;
    last_cpu_seconds_ = cpu;
    last_sample_ = now;
  }
  if (!has_rank_) return;
  const auto l = Labels();
  if (moe_counts_) {
    // Counters grow by what the model counted since the last scrape.
    for (int64_t e = moe_counts_->expert_begin(); e < moe_counts_->expert_end(); ++e) {
      int64_t& exported = moe_exported_[static_cast<size_t>(e - moe_counts_->expert_begin())];
      const int64_t now = moe_counts_->Tokens(e);
      auto le = l;
      le.push_back(std::to_string(e));
      registry_->Counter(metric::kMoeExpertTokensTotal)
          .WithLabels(le)
          .Inc(static_cast<double>(now - exported));
      exported = now;
    }
  }
  registry_->Gauge(metric::kGpuMemoryUsedBytes).WithLabels(l).Set(static_cast<double>(used));
  registry_->Gauge(metric::kGpuMemoryTotalBytes).WithLabels(l).Set(static_cast<double>(total));
  registry_->Gauge(metric::kGpuActivationBytes)
      .WithLabels(l)
      .Set(static_cast<double>(std::max<int64_t>(0, used - weight_bytes_ - kv_bytes_)));
  if (util >= 0) registry_->Gauge(metric::kGpuUtilizationRatio).WithLabels(l).Set(util);
  if (clock_) clock_->Flush();
}

}  // namespace tessera
