#include "common/metrics/metrics_registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <type_traits>

#include "common/metrics/metric_catalog.h"

namespace tessera {

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

namespace {

void AtomicAdd(std::atomic<double>& a, double delta) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + delta, std::memory_order_relaxed)) {
  }
}

bool ValidMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view n) {
  if (n.empty() || n.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// `{a="x",b="y"}` with `extra` appended as the last label (for le); "" when
// there are no labels at all.
std::string LabelBlock(const std::vector<std::string>& names,
                       const std::vector<std::string>& values, std::string_view extra_name = {},
                       std::string_view extra_value = {}) {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
  return out;
}

void Header(std::string& out, const std::string& name, const std::string& help, MetricType type) {
  out += "# HELP " + name + " " + EscapeHelp(help) + "\n";
  out += "# TYPE " + name + " " + MetricTypeName(type) + "\n";
}

}  // namespace

std::string EscapeHelp(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

void Counter::Inc(double delta) {
  if (!(delta >= 0)) return;
  AtomicAdd(value_, delta);
}

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t acc = 0;
  for (uint64_t c : counts_) s.cumulative.push_back(acc += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  TESSERA_CHECK(start > 0 && factor > 1 && count >= 1);
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

template <typename M>
M& MetricFamily<M>::WithLabels(const std::vector<std::string>& values) {
  TESSERA_CHECK(values.size() == label_names_.size());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(values);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<M> child;
  if constexpr (std::is_same_v<M, Histogram>) {
    child = std::make_unique<M>(buckets_);
  } else {
    child = std::make_unique<M>();
  }
  M& ref = *child;
  children_.emplace(values, std::move(child));
  return ref;
}

template <typename M>
void MetricFamily<M>::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  children_.clear();
}

template <typename M>
void MetricFamily<M>::ForEach(
    const std::function<void(const std::vector<std::string>&, const M&)>& fn) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, child] : children_) fn(values, *child);
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

Status MetricsRegistry::CheckNew(const std::string& name, MetricType type,
                                 const std::vector<std::string>& label_names) const {
  if (!ValidMetricName(name))
    return InvalidArgument("metric name '" + name + "' is not [a-zA-Z_:][a-zA-Z0-9_:]*");
  if (type == MetricType::kCounter && !EndsWith(name, "_total"))
    return InvalidArgument("counter '" + name + "' must end in _total");
  std::set<std::string> seen;
  for (const std::string& l : label_names) {
    if (!ValidLabelName(l))
      return InvalidArgument("metric '" + name + "': label name '" + l +
                             "' is not [a-zA-Z_][a-zA-Z0-9_]* or starts with __");
    if (!seen.insert(l).second)
      return InvalidArgument("metric '" + name + "': label '" + l + "' repeated");
    if (type == MetricType::kHistogram && l == "le")
      return InvalidArgument("histogram '" + name + "': label 'le' is reserved");
  }
  std::vector<std::string> taken = {name};
  if (type == MetricType::kHistogram)
    for (const char* s : {"_bucket", "_sum", "_count"}) taken.push_back(name + s);
  for (const auto& e : entries_) {
    std::string other;
    if (e->counter) other = e->counter->name();
    if (e->gauge) other = e->gauge->name();
    if (e->histogram) other = e->histogram->name();
    std::vector<std::string> theirs = {other};
    if (e->type == MetricType::kHistogram)
      for (const char* s : {"_bucket", "_sum", "_count"}) theirs.push_back(other + s);
    for (const std::string& a : taken)
      for (const std::string& b : theirs)
        if (a == b) return InvalidArgument("metric '" + name + "' collides with '" + other + "'");
  }
  return Status::Ok();
}

StatusOr<CounterFamily*> MetricsRegistry::AddCounter(std::string name, std::string help,
                                                     std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_RETURN_IF_ERROR(CheckNew(name, MetricType::kCounter, label_names));
  auto e = std::make_unique<Entry>();
  e->type = MetricType::kCounter;
  e->counter = std::make_unique<CounterFamily>(std::move(name), std::move(help),
                                               MetricType::kCounter, std::move(label_names));
  if (e->counter->label_names().empty()) e->counter->WithLabels({});
  CounterFamily* f = e->counter.get();
  entries_.push_back(std::move(e));
  return f;
}

StatusOr<GaugeFamily*> MetricsRegistry::AddGauge(std::string name, std::string help,
                                                 std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_RETURN_IF_ERROR(CheckNew(name, MetricType::kGauge, label_names));
  auto e = std::make_unique<Entry>();
  e->type = MetricType::kGauge;
  e->gauge = std::make_unique<GaugeFamily>(std::move(name), std::move(help), MetricType::kGauge,
                                           std::move(label_names));
  if (e->gauge->label_names().empty()) e->gauge->WithLabels({});
  GaugeFamily* f = e->gauge.get();
  entries_.push_back(std::move(e));
  return f;
}

StatusOr<HistogramFamily*> MetricsRegistry::AddHistogram(std::string name, std::string help,
                                                         std::vector<std::string> label_names,
                                                         std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_RETURN_IF_ERROR(CheckNew(name, MetricType::kHistogram, label_names));
  if (buckets.empty()) return InvalidArgument("histogram '" + name + "' has no buckets");
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i]))
      return InvalidArgument("histogram '" + name + "': bucket " + std::to_string(i) +
                             " is not finite (+Inf is implicit)");
    if (i > 0 && !(buckets[i] > buckets[i - 1]))
      return InvalidArgument("histogram '" + name + "': buckets are not strictly ascending at " +
                             std::to_string(i));
  }
  auto e = std::make_unique<Entry>();
  e->type = MetricType::kHistogram;
  e->histogram =
      std::make_unique<HistogramFamily>(std::move(name), std::move(help), MetricType::kHistogram,
                                        std::move(label_names), std::move(buckets));
  if (e->histogram->label_names().empty()) e->histogram->WithLabels({});
  HistogramFamily* f = e->histogram.get();
  entries_.push_back(std::move(e));
  return f;
}

Status MetricsRegistry::FromCatalog(std::string_view component) {
  for (const MetricSpec& s : MetricCatalog()) {
    if (s.component != component) continue;
    switch (s.type) {
      case MetricType::kCounter:
        TESSERA_RETURN_IF_ERROR(AddCounter(s.name, s.help, s.labels).status());
        break;
      case MetricType::kGauge:
        TESSERA_RETURN_IF_ERROR(AddGauge(s.name, s.help, s.labels).status());
        break;
      case MetricType::kHistogram:
        TESSERA_RETURN_IF_ERROR(AddHistogram(s.name, s.help, s.labels, s.buckets).status());
        break;
    }
  }
  return Status::Ok();
}

const MetricsRegistry::Entry* MetricsRegistry::Find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : entries_) {
    const std::string& n = e->counter ? e->counter->name()
                           : e->gauge ? e->gauge->name()
                                      : e->histogram->name();
    if (n == name) return e.get();
  }
  return nullptr;
}

CounterFamily& MetricsRegistry::Counter(std::string_view name) {
  const Entry* e = Find(name);
  TESSERA_CHECK(e != nullptr && e->counter != nullptr);
  return *e->counter;
}

GaugeFamily& MetricsRegistry::Gauge(std::string_view name) {
  const Entry* e = Find(name);
  TESSERA_CHECK(e != nullptr && e->gauge != nullptr);
  return *e->gauge;
}

HistogramFamily& MetricsRegistry::Histogram(std::string_view name) {
  const Entry* e = Find(name);
  TESSERA_CHECK(e != nullptr && e->histogram != nullptr);
  return *e->histogram;
}

void MetricsRegistry::AddCollectHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.push_back(std::move(hook));
}

std::string MetricsRegistry::Render() {
  std::lock_guard<std::mutex> render_lock(render_mu_);
  std::vector<std::function<void()>> hooks;
  std::vector<const Entry*> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hooks = hooks_;
    for (const auto& e : entries_) entries.push_back(e.get());
  }
  for (auto& h : hooks) h();
  std::string out;
  for (const Entry* e : entries) {
    if (e->counter) {
      const CounterFamily& f = *e->counter;
      Header(out, f.name(), f.help(), f.type());
      f.ForEach([&](const std::vector<std::string>& v, const tessera::Counter& c) {
        out +=
            f.name() + LabelBlock(f.label_names(), v) + " " + FormatMetricValue(c.value()) + "\n";
      });
    } else if (e->gauge) {
      const GaugeFamily& f = *e->gauge;
      Header(out, f.name(), f.help(), f.type());
      f.ForEach([&](const std::vector<std::string>& v, const tessera::Gauge& g) {
        out +=
            f.name() + LabelBlock(f.label_names(), v) + " " + FormatMetricValue(g.value()) + "\n";
      });
    } else {
      const HistogramFamily& f = *e->histogram;
      Header(out, f.name(), f.help(), f.type());
      f.ForEach([&](const std::vector<std::string>& v, const tessera::Histogram& h) {
        const tessera::Histogram::Snapshot s = h.Take();
        for (size_t i = 0; i <= s.bounds.size(); ++i) {
          const std::string le = i < s.bounds.size() ? FormatMetricValue(s.bounds[i]) : "+Inf";
          out += f.name() + "_bucket" + LabelBlock(f.label_names(), v, "le", le) + " " +
                 std::to_string(s.cumulative[i]) + "\n";
        }
        const std::string labels = LabelBlock(f.label_names(), v);
        out += f.name() + "_sum" + labels + " " + FormatMetricValue(s.sum) + "\n";
        out += f.name() + "_count" + labels + " " + std::to_string(s.count) + "\n";
      });
    }
  }
  return out;
}

}  // namespace tessera
