// MetricsRegistry: counters, gauges and histograms with labels, rendered in
// the Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// A family is one metric name with fixed label names; each distinct tuple of
// label values is one child (one time series, or one histogram's bucket,
// _sum and _count series). Children are created on first use and live as
// long as the registry, so references returned by WithLabels stay valid.
//
//   MetricsRegistry reg;
//   auto& requests = reg.AddCounter("tessera_requests_total", "Requests.", {"status"});
//   requests.WithLabels({"eos"}).Inc();
//   std::string text = reg.Render();   // "# HELP ...\n# TYPE ... counter\n..."
//
// Tessera's own metrics are declared once, with their help text, labels and
// buckets, in common/metrics/metric_catalog.h; FromCatalog() creates every family of
// one component from it.
//
// Rendering: families in registration order, children in label-value order;
// HELP text escapes '\' and newline; label values escape '\', '"' and newline;
// values are printed as the shortest decimal that round-trips, with +Inf, -Inf
// and NaN spelled as Prometheus expects. Histograms print cumulative
// `_bucket{le="..."}` series (ending with le="+Inf"), then `_sum` and `_count`.
//
// Thread-safety: every method of the registry, the families and the
// children may be called from any thread. Collect hooks run on the thread
// that calls Render, one Render at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tessera {

enum class MetricType { kCounter, kGauge, kHistogram };
const char* MetricTypeName(MetricType type);  // "counter", "gauge", "histogram"

// A value that only goes up (reset when the process restarts).
class Counter {
 public:
  // Adds `delta` (>= 0; a negative or NaN delta is ignored: counters never go down).
  void Inc(double delta = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into buckets with upper bounds `bounds` (ascending,
// finite; the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  // NaN observations are ignored.
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;        // upper bounds, without +Inf
    std::vector<uint64_t> cumulative;  // observations <= bounds[i]; size bounds.size() + 1 (+Inf)
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot Take() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), +Inf last; protected by mu_
  double sum_ = 0.0;              // protected by mu_
  uint64_t count_ = 0;            // protected by mu_
};

// Bucket bounds start, start*factor, ... (count of them). Requires start > 0,
// factor > 1, count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// One metric name with fixed label names and a child per label-value tuple.
template <typename M>
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<std::string> label_names, std::vector<double> buckets = {})
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        label_names_(std::move(label_names)),
        buckets_(std::move(buckets)) {}

  // The child for `values` (one per label name, in order), created on first
  // use. A wrong number of values is a programming error (checked).
  M& WithLabels(const std::vector<std::string>& values);
  // Drops every child (for gauges recomputed from scratch at each collect).
  void Clear();

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Calls fn(label values, child) for every child, in label-value order.
  void ForEach(const std::function<void(const std::vector<std::string>&, const M&)>& fn) const;

 private:
  const std::string name_, help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::vector<double> buckets_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<M>> children_;  // protected by mu_
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family. Errors (kInvalidArgument, naming the metric): a name
  // that is not [a-zA-Z_:][a-zA-Z0-9_:]*, a counter whose name does not end in
  // "_total", a label name that is not [a-zA-Z_][a-zA-Z0-9_]* or starts with
  // "__", a repeated label name, "le" on a histogram, histogram buckets that
  // are empty, not finite or not strictly ascending, or a name (for
  // histograms also name_bucket/_sum/_count) already taken.
  // A family without labels gets its one child at once, so it renders as 0.
  StatusOr<CounterFamily*> AddCounter(std::string name, std::string help,
                                      std::vector<std::string> label_names = {});
  StatusOr<GaugeFamily*> AddGauge(std::string name, std::string help,
                                  std::vector<std::string> label_names = {});
  StatusOr<HistogramFamily*> AddHistogram(std::string name, std::string help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> buckets);

  // Registers every catalog metric (common/metrics/metric_catalog.h) whose component
  // is `component` ("coordinator" or "worker"). Errors: as Add*.
  Status FromCatalog(std::string_view component);
  // A registered family by name; a missing one or one of another type is a
  // programming error (checked).
  CounterFamily& Counter(std::string_view name);
  GaugeFamily& Gauge(std::string_view name);
  HistogramFamily& Histogram(std::string_view name);

  // `hook` runs at the start of every Render (e.g. to sample memory into
  // gauges). Hooks run in registration order.
  void AddCollectHook(std::function<void()> hook);

  // The exposition text (Content-Type: kPrometheusContentType).
  std::string Render();

 private:
  struct Entry {
    MetricType type;
    std::unique_ptr<CounterFamily> counter;
    std::unique_ptr<GaugeFamily> gauge;
    std::unique_ptr<HistogramFamily> histogram;
  };
  Status CheckNew(const std::string& name, MetricType type,
                  const std::vector<std::string>& label_names) const;
  const Entry* Find(std::string_view name) const;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;  // protected by mu_
  std::mutex render_mu_;
  std::vector<std::function<void()>> hooks_;  // protected by mu_
};

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Text-format helpers (exposed for tests).
std::string EscapeHelp(std::string_view text);        // '\' -> "\\", newline -> "\n"
std::string EscapeLabelValue(std::string_view text);  // also '"' -> "\""
std::string FormatMetricValue(double value);          // "+Inf", "-Inf", "NaN" or shortest decimal

}  // namespace tessera
