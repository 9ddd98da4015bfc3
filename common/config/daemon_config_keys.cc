// The table of every config key (common/config/daemon_config_internal.h):
// how each is read from a TOML node and written back, the enum spellings,
// and the messages for unknown tables and keys.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>

#include "common/base/quote.h"
#include "common/config/daemon_config_internal.h"

namespace tessera {
namespace config_internal {

// ---------------------------------------------------------------------------
// Locations and value rendering for error messages.

std::string Loc(const toml::source_region& r, const std::string& path) {
  return fmt::format("{}:{}:{}", path, r.begin.line, r.begin.column);
}

// A TOML basic string literal for `s` (always double-quoted, escaped).
std::string Quote(const std::string& s) { return QuoteForMessage(s); }

// A value as TOML text, strings double-quoted.
std::string ValueText(const toml::node& n) {
  if (const auto* s = n.as_string()) return Quote(s->get());
  if (const auto* i = n.as_integer()) return std::to_string(i->get());
  if (const auto* f = n.as_floating_point()) return FormatDouble(f->get());
  if (const auto* b = n.as_boolean()) return b->get() ? "true" : "false";
  if (const auto* a = n.as_array()) {
    std::vector<std::string> items;
    for (const toml::node& e : *a) items.push_back(ValueText(e));
    return fmt::format("[{}]", fmt::join(items, ", "));
  }
  std::ostringstream os;
  n.visit([&os](const auto& v) { os << v; });
  return os.str();
}

// "integer 0", "string \"64\"", "array [1, 2]", "a table".
std::string Show(const toml::node& n) {
  std::string type;
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      type = "array";
      break;
    case toml::node_type::string:
      type = "string";
      break;
    case toml::node_type::integer:
      type = "integer";
      break;
    case toml::node_type::floating_point:
      type = "float";
      break;
    case toml::node_type::boolean:
      type = "boolean";
      break;
    case toml::node_type::date:
      type = "date";
      break;
    case toml::node_type::time:
      type = "time";
      break;
    case toml::node_type::date_time:
      type = "date-time";
      break;
    case toml::node_type::none:
      return "nothing";
  }
  std::string text = ValueText(n);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return type + " " + text;
}

// Shortest round-trip form of a double, always with a '.', 'e', inf or nan so
// that TOML reads it back as a float.
std::string FormatDouble(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// Edit distance, for "did you mean" on unknown keys.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

Status KeyError(const std::string& where, const std::string& key, const std::string& what) {
  return InvalidArgument(where + ": " + key + ": " + what);
}

// ---------------------------------------------------------------------------
// Enum spellings: the one list per enum, used by parsing, formatting and the
// *Name functions.

template <typename E>
struct Choice {
  const char* name;
  E value;
};

const std::vector<Choice<std::optional<DType>>>& DTypeChoices() {
  static const std::vector<Choice<std::optional<DType>>> c = {{"auto", std::nullopt},
                                                              {"float32", DType::kF32},
                                                              {"bfloat16", DType::kBF16},
                                                              {"float16", DType::kF16}};
  return c;
}
const std::vector<Choice<std::optional<ChatFormat>>>& ChatTemplateChoices() {
  static const std::vector<Choice<std::optional<ChatFormat>>> c = {{"", std::nullopt},
                                                                   {"chatml", ChatFormat::kChatML},
                                                                   {"llama3", ChatFormat::kLlama3},
                                                                   {"llama2", ChatFormat::kLlama2}};
  return c;
}
const std::vector<Choice<QuantMethod>>& QuantizationChoices() {
  static const std::vector<Choice<QuantMethod>> c = {{"none", QuantMethod::kNone},
                                                     {"fp8", QuantMethod::kOnlineFp8}};
  return c;
}
const std::vector<Choice<KvCacheDType>>& KvCacheDTypeChoices() {
  static const std::vector<Choice<KvCacheDType>> c = {{"auto", KvCacheDType::kAuto},
                                                      {"fp8", KvCacheDType::kFp8}};
  return c;
}
const std::vector<Choice<SchedulerHost>>& SchedulerHostChoices() {
  static const std::vector<Choice<SchedulerHost>> c = {{"coordinator", SchedulerHost::kCoordinator},
                                                       {"leader", SchedulerHost::kLeader}};
  return c;
}
const std::vector<Choice<PrefillChunkBudget>>& PrefillChunkBudgetChoices() {
  static const std::vector<Choice<PrefillChunkBudget>> c = {
      {"cost", PrefillChunkBudget::kCost}, {"tokens", PrefillChunkBudget::kTokens}};
  return c;
}
const std::vector<Choice<ParallelMode>>& ParallelModeChoices() {
  static const std::vector<Choice<ParallelMode>> c = {{"auto", ParallelMode::kAuto},
                                                      {"explicit", ParallelMode::kExplicit}};
  return c;
}
const std::vector<Choice<ParallelObjective>>& ParallelObjectiveChoices() {
  static const std::vector<Choice<ParallelObjective>> c = {
      {"latency", ParallelObjective::kLatency}, {"throughput", ParallelObjective::kThroughput}};
  return c;
}
const std::vector<Choice<LogLevel>>& LogLevelChoices() {
  static const std::vector<Choice<LogLevel>> c = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"critical", LogLevel::kCritical}};
  return c;
}
const std::vector<Choice<LogFormat>>& LogFormatChoices() {
  static const std::vector<Choice<LogFormat>> c = {{"text", LogFormat::kText},
                                                   {"json", LogFormat::kJson}};
  return c;
}
const std::vector<Choice<WorkerBackend>>& WorkerBackendChoices() {
  static const std::vector<Choice<WorkerBackend>> c = {
      {"auto", WorkerBackend::kAuto}, {"cpu", WorkerBackend::kCpu}, {"cuda", WorkerBackend::kCuda}};
  return c;
}

template <typename E>
const char* ChoiceName(const std::vector<Choice<E>>& choices, const E& value) {
  for (const auto& c : choices) {
    if (c.value == value) return c.name;
  }
  return "?";
}

// ---------------------------------------------------------------------------
// The table of every key: how to read it from a TOML node and write it back.

// A field of a section of DaemonConfig: (config.*section).*field.
template <typename S, typename T>
struct Member {
  S DaemonConfig::*section;
  T S::*field;
  T& operator()(DaemonConfig& c) const { return (c.*section).*field; }
  const T& operator()(const DaemonConfig& c) const { return (c.*section).*field; }
};

template <typename S>
Field StringField(const char* table, const char* key, Member<S, std::string> m) {
  std::string full = std::string(table) + "." + key;
  return Field{table,
               key,
               "a string",
               true,
               [m, full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
                 if (!n.is_string())
                   return KeyError(loc(n), full, "expected a string, got " + Show(n));
                 m(c) = *n.value<std::string>();
                 return Status::Ok();
               },
               [m](const DaemonConfig& c) { return Quote(m(c)); }};
}

template <typename T>
Status ReadInt(const toml::node& n, const Locator& loc, const std::string& key, T* out) {
  if (!n.is_integer()) return KeyError(loc(n), key, "expected an integer, got " + Show(n));
  int64_t v = n.as_integer()->get();
  if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
    return KeyError(loc(n), key,
                    fmt::format("must be between {} and {}, got {}", std::numeric_limits<T>::min(),
                                std::numeric_limits<T>::max(), v));
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

template <typename S, typename T>
Field IntField(const char* table, const char* key, Member<S, T> m) {
  std::string full = std::string(table) + "." + key;
  return Field{table,
               key,
               "an integer",
               false,
               [m, full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
                 return ReadInt<T>(n, loc, full, &m(c));
               },
               [m](const DaemonConfig& c) { return std::to_string(m(c)); }};
}

template <typename S>
Field NumberField(const char* table, const char* key, Member<S, double> m) {
  std::string full = std::string(table) + "." + key;
  return Field{table,
               key,
               "a number",
               false,
               [m, full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
                 if (!n.is_number())
                   return KeyError(loc(n), full, "expected a number, got " + Show(n));
                 m(c) = *n.value<double>();
                 return Status::Ok();
               },
               [m](const DaemonConfig& c) { return FormatDouble(m(c)); }};
}

template <typename S>
Field BoolField(const char* table, const char* key, Member<S, bool> m) {
  std::string full = std::string(table) + "." + key;
  return Field{table,
               key,
               "a boolean",
               false,
               [m, full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
                 if (!n.is_boolean())
                   return KeyError(loc(n), full, "expected true or false, got " + Show(n));
                 m(c) = *n.value<bool>();
                 return Status::Ok();
               },
               [m](const DaemonConfig& c) { return std::string(m(c) ? "true" : "false"); }};
}

// Reads `n` as an array of integers into *out; `key` names it in errors.
Status ReadIntList(const toml::node& n, const Locator& loc, const std::string& key,
                   std::vector<int>* out) {
  if (!n.is_array()) return KeyError(loc(n), key, "expected an array of integers, got " + Show(n));
  std::vector<int> values;
  const toml::array& arr = *n.as_array();
  for (size_t i = 0; i < arr.size(); ++i) {
    int v = 0;
    TESSERA_RETURN_IF_ERROR(ReadInt<int>(arr[i], loc, fmt::format("{}[{}]", key, i), &v));
    values.push_back(v);
  }
  *out = std::move(values);
  return Status::Ok();
}

template <typename S>
Field IntListField(const char* table, const char* key, Member<S, std::vector<int>> m) {
  std::string full = std::string(table) + "." + key;
  return Field{table,
               key,
               "an array of integers",
               false,
               [m, full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
                 return ReadIntList(n, loc, full, &m(c));
               },
               [m](const DaemonConfig& c) { return fmt::format("[{}]", fmt::join(m(c), ", ")); }};
}

// A tp key: an integer (the tp of every stage; *tp_per_stage cleared) or an
// array of integers (one per stage; *tp = 0).
Status ReadTp(const toml::node& n, const Locator& loc, const std::string& key, int* tp,
              std::vector<int>* tp_per_stage) {
  if (n.is_integer()) {
    int v = 0;
    TESSERA_RETURN_IF_ERROR(ReadInt<int>(n, loc, key, &v));
    *tp = v;
    tp_per_stage->clear();
    return Status::Ok();
  }
  if (!n.is_array()) {
    return KeyError(loc(n), key,
                    "expected an integer or an array of integers (one per stage), got " + Show(n));
  }
  if (n.as_array()->empty()) return KeyError(loc(n), key, "expected one entry per stage, got []");
  std::vector<int> values;
  TESSERA_RETURN_IF_ERROR(ReadIntList(n, loc, key, &values));
  *tp = 0;
  *tp_per_stage = std::move(values);
  return Status::Ok();
}

std::string FormatTp(int tp, const std::vector<int>& tp_per_stage) {
  return tp_per_stage.empty() ? std::to_string(tp)
                              : fmt::format("[{}]", fmt::join(tp_per_stage, ", "));
}

// parallel.tp: an integer (the tp of every stage) or an array of integers
// (one per stage, ParallelSection::tp_per_stage).
Field TpField() {
  const std::string full = "parallel.tp";
  return Field{
      "parallel",
      "tp",
      "an integer or an array of integers",
      false,
      [full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
        return ReadTp(n, loc, full, &c.parallel.tp, &c.parallel.tp_per_stage);
      },
      [](const DaemonConfig& c) { return FormatTp(c.parallel.tp, c.parallel.tp_per_stage); }};
}

// parallel.replica_override: an array of tables ([[parallel.replica_override]]
// in a file, an array of inline tables in --set or FormatDaemonConfig), each
// with `replica` and the layout keys tp, pp, layers_per_stage. Where each
// entry and each of its keys was given goes to config.sources as
// "parallel.replica_override[i]" and "parallel.replica_override[i].<key>",
// so that validation and the coordinator can name them.
Field ReplicaOverrideField() {
  const std::string full = "parallel.replica_override";
  return Field{
      "parallel",
      "replica_override",
      "an array of tables (replica, tp, pp, layers_per_stage)",
      false,
      [full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
        if (!n.is_array())
          return KeyError(
              loc(n), full,
              "expected an array of tables ([[parallel.replica_override]]), got " + Show(n));
        std::vector<ReplicaOverride> overrides;
        std::map<std::string, std::string> where;
        const toml::array& arr = *n.as_array();
        for (size_t i = 0; i < arr.size(); ++i) {
          const std::string entry = fmt::format("{}[{}]", full, i);
          if (!arr[i].is_table())
            return KeyError(loc(arr[i]), entry, "expected a table, got " + Show(arr[i]));
          where[entry] = loc(arr[i]);
          ReplicaOverride o;
          bool has_replica = false;
          for (auto&& [k, v] : *arr[i].as_table()) {
            const std::string name(k.str());
            const std::string key = entry + "." + name;
            if (name == "replica") {
              TESSERA_RETURN_IF_ERROR(ReadInt<int>(v, loc, key, &o.replica));
              has_replica = true;
            } else if (name == "tp") {
              TESSERA_RETURN_IF_ERROR(ReadTp(v, loc, key, &o.layout.tp, &o.layout.tp_per_stage));
            } else if (name == "pp") {
              TESSERA_RETURN_IF_ERROR(ReadInt<int>(v, loc, key, &o.layout.pp));
            } else if (name == "layers_per_stage") {
              TESSERA_RETURN_IF_ERROR(ReadIntList(v, loc, key, &o.layout.layers_per_stage));
            } else {
              return KeyError(loc(v), key,
                              "unknown key; valid keys of a replica override: replica, tp, pp, "
                              "layers_per_stage");
            }
            where[key] = loc(v);
          }
          if (!has_replica)
            return KeyError(loc(arr[i]), entry,
                            "needs `replica`, the index of the replica whose layout it gives");
          overrides.push_back(std::move(o));
        }
        // The new entries replace the old ones, and where they were given.
        for (auto it = c.sources.lower_bound(full + "[");
             it != c.sources.end() && it->first.rfind(full + "[", 0) == 0;)
          it = c.sources.erase(it);
        c.sources.insert(where.begin(), where.end());
        c.parallel.replica_overrides = std::move(overrides);
        return Status::Ok();
      },
      [](const DaemonConfig& c) {
        std::vector<std::string> entries;
        for (const ReplicaOverride& o : c.parallel.replica_overrides)
          entries.push_back(
              fmt::format("{{replica = {}, tp = {}, pp = {}, layers_per_stage = [{}]}}", o.replica,
                          FormatTp(o.layout.tp, o.layout.tp_per_stage), o.layout.pp,
                          fmt::join(o.layout.layers_per_stage, ", ")));
        return fmt::format("[{}]", fmt::join(entries, ", "));
      }};
}

template <typename S>
Field StringListField(const char* table, const char* key, Member<S, std::vector<std::string>> m) {
  std::string full = std::string(table) + "." + key;
  return Field{table,
               key,
               "an array of strings",
               false,
               [m, full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
                 if (!n.is_array()) {
                   return KeyError(loc(n), full, "expected an array of strings, got " + Show(n));
                 }
                 std::vector<std::string> values;
                 const toml::array& arr = *n.as_array();
                 for (size_t i = 0; i < arr.size(); ++i) {
                   if (!arr[i].is_string())
                     return KeyError(loc(arr[i]), fmt::format("{}[{}]", full, i),
                                     "expected a string, got " + Show(arr[i]));
                   values.push_back(*arr[i].value<std::string>());
                 }
                 m(c) = std::move(values);
                 return Status::Ok();
               },
               [m](const DaemonConfig& c) {
                 std::vector<std::string> quoted;
                 for (const std::string& v : m(c)) quoted.push_back(Quote(v));
                 return fmt::format("[{}]", fmt::join(quoted, ", "));
               }};
}

template <typename S, typename E>
Field EnumField(const char* table, const char* key, Member<S, E> m,
                const std::vector<Choice<E>>& choices) {
  std::string full = std::string(table) + "." + key;
  std::vector<std::string> quoted;
  for (const auto& ch : choices) quoted.push_back(Quote(ch.name));
  std::string valid = fmt::format("{}", fmt::join(quoted, ", "));
  const std::vector<Choice<E>>* all = &choices;  // a function-static list
  return Field{
      table,
      key,
      "one of " + valid,
      true,
      [m, full, all, valid](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
        if (!n.is_string()) {
          return KeyError(loc(n), full, "expected a string (one of " + valid + "), got " + Show(n));
        }
        const std::string& s = n.as_string()->get();
        for (const auto& ch : *all) {
          if (s == ch.name) {
            m(c) = ch.value;
            return Status::Ok();
          }
        }
        return KeyError(loc(n), full, "must be one of " + valid + ", got " + Quote(s));
      },
      [m, all](const DaemonConfig& c) { return Quote(ChoiceName(*all, m(c))); }};
}

// Tables in file order; keys in each table in declaration order.
const std::vector<std::string>& Tables() {
  static const std::vector<std::string> t = {
      "model", "parallel", "server", "heartbeat", "kv_cache", "scheduler",
      "admin", "control",  "store",  "logging",   "worker",   "structured_output"};
  return t;
}

const std::vector<Field>& Fields() {
  using D = DaemonConfig;
  static const std::vector<Field> fields = {
      StringField("model", "path",
                  Member<ModelSection, std::string>{&D::model, &ModelSection::path}),
      StringField("model", "name",
                  Member<ModelSection, std::string>{&D::model, &ModelSection::name}),
      EnumField("model", "dtype",
                Member<ModelSection, std::optional<DType>>{&D::model, &ModelSection::dtype},
                DTypeChoices()),
      EnumField(
          "model", "chat_template",
          Member<ModelSection, std::optional<ChatFormat>>{&D::model, &ModelSection::chat_template},
          ChatTemplateChoices()),
      EnumField("model", "quantization",
                Member<ModelSection, QuantMethod>{&D::model, &ModelSection::quantization},
                QuantizationChoices()),

      EnumField("parallel", "mode",
                Member<ParallelSection, ParallelMode>{&D::parallel, &ParallelSection::mode},
                ParallelModeChoices()),
      TpField(),
      IntField("parallel", "pp", Member<ParallelSection, int>{&D::parallel, &ParallelSection::pp}),
      IntListField("parallel", "layers_per_stage",
                   Member<ParallelSection, std::vector<int>>{&D::parallel,
                                                             &ParallelSection::layers_per_stage}),
      IntField("parallel", "workers",
               Member<ParallelSection, int>{&D::parallel, &ParallelSection::workers}),
      IntField("parallel", "replicas",
               Member<ParallelSection, int>{&D::parallel, &ParallelSection::replicas}),
      EnumField(
          "parallel", "objective",
          Member<ParallelSection, ParallelObjective>{&D::parallel, &ParallelSection::objective},
          ParallelObjectiveChoices()),
      ReplicaOverrideField(),
      BoolField("parallel", "expert_parallel",
                Member<ParallelSection, bool>{&D::parallel, &ParallelSection::expert_parallel}),

      StringField("server", "host",
                  Member<ServerSection, std::string>{&D::server, &ServerSection::host}),
      IntField("server", "port", Member<ServerSection, int>{&D::server, &ServerSection::port}),
      StringField("server", "control_endpoint",
                  Member<ServerSection, std::string>{&D::server, &ServerSection::control_endpoint}),
      StringField("server", "tls_cert",
                  Member<ServerSection, std::string>{&D::server, &ServerSection::tls_cert}),
      StringField("server", "tls_key",
                  Member<ServerSection, std::string>{&D::server, &ServerSection::tls_key}),
      NumberField("server", "read_timeout_seconds",
                  Member<ServerSection, double>{&D::server, &ServerSection::read_timeout_seconds}),
      IntField("server", "max_body_bytes",
               Member<ServerSection, int64_t>{&D::server, &ServerSection::max_body_bytes}),
      IntField("server", "max_connections",
               Member<ServerSection, int>{&D::server, &ServerSection::max_connections}),
      IntField("server", "max_header_count",
               Member<ServerSection, int>{&D::server, &ServerSection::max_header_count}),
      IntField("server", "max_streams",
               Member<ServerSection, int>{&D::server, &ServerSection::max_streams}),
      IntField("server", "max_workers",
               Member<ServerSection, int>{&D::server, &ServerSection::max_workers}),
      IntField("server", "max_prompt_bytes",
               Member<ServerSection, int64_t>{&D::server, &ServerSection::max_prompt_bytes}),
      IntField("server", "request_threads",
               Member<ServerSection, int>{&D::server, &ServerSection::request_threads}),

      NumberField(
          "heartbeat", "interval_seconds",
          Member<HeartbeatSection, double>{&D::heartbeat, &HeartbeatSection::interval_seconds}),
      NumberField(
          "heartbeat", "timeout_seconds",
          Member<HeartbeatSection, double>{&D::heartbeat, &HeartbeatSection::timeout_seconds}),
      NumberField("heartbeat", "forget_failed_after_seconds",
                  Member<HeartbeatSection, double>{&D::heartbeat,
                                                   &HeartbeatSection::forget_failed_after_seconds}),
      NumberField(
          "heartbeat", "load_timeout_seconds",
          Member<HeartbeatSection, double>{&D::heartbeat, &HeartbeatSection::load_timeout_seconds}),
      NumberField(
          "heartbeat", "step_timeout_seconds",
          Member<HeartbeatSection, double>{&D::heartbeat, &HeartbeatSection::step_timeout_seconds}),

      NumberField("kv_cache", "memory_fraction",
                  Member<KvCacheSection, double>{&D::kv_cache, &KvCacheSection::memory_fraction}),
      IntField("kv_cache", "block_size",
               Member<KvCacheSection, int>{&D::kv_cache, &KvCacheSection::block_size}),
      IntField("kv_cache", "max_blocks",
               Member<KvCacheSection, int64_t>{&D::kv_cache, &KvCacheSection::max_blocks}),
      BoolField("kv_cache", "prefix_caching",
                Member<KvCacheSection, bool>{&D::kv_cache, &KvCacheSection::prefix_caching}),
      EnumField("kv_cache", "dtype",
                Member<KvCacheSection, KvCacheDType>{&D::kv_cache, &KvCacheSection::dtype},
                KvCacheDTypeChoices()),

      IntField(
          "scheduler", "max_batch_tokens",
          Member<SchedulerSection, int64_t>{&D::scheduler, &SchedulerSection::max_batch_tokens}),
      IntField("scheduler", "max_sequences",
               Member<SchedulerSection, int64_t>{&D::scheduler, &SchedulerSection::max_sequences}),
      IntField("scheduler", "queue_limit",
               Member<SchedulerSection, int64_t>{&D::scheduler, &SchedulerSection::queue_limit}),
      IntField("scheduler", "max_context",
               Member<SchedulerSection, int64_t>{&D::scheduler, &SchedulerSection::max_context}),
      IntField("scheduler", "prefill_chunk_tokens",
               Member<SchedulerSection, int64_t>{&D::scheduler,
                                                 &SchedulerSection::prefill_chunk_tokens}),
      EnumField("scheduler", "prefill_chunk_budget",
                Member<SchedulerSection, PrefillChunkBudget>{
                    &D::scheduler, &SchedulerSection::prefill_chunk_budget},
                PrefillChunkBudgetChoices()),
      IntField(
          "scheduler", "max_prompt_tokens",
          Member<SchedulerSection, int64_t>{&D::scheduler, &SchedulerSection::max_prompt_tokens}),
      IntField("scheduler", "max_completion_tokens",
               Member<SchedulerSection, int64_t>{&D::scheduler,
                                                 &SchedulerSection::max_completion_tokens}),
      NumberField("scheduler", "drain_timeout_seconds",
                  Member<SchedulerSection, double>{&D::scheduler,
                                                   &SchedulerSection::drain_timeout_seconds}),
      EnumField("scheduler", "runs_on",
                Member<SchedulerSection, SchedulerHost>{&D::scheduler, &SchedulerSection::runs_on},
                SchedulerHostChoices()),

      StringField("admin", "host",
                  Member<AdminSection, std::string>{&D::admin, &AdminSection::host}),
      IntField("admin", "port", Member<AdminSection, int>{&D::admin, &AdminSection::port}),
      BoolField("admin", "pick_port",
                Member<AdminSection, bool>{&D::admin, &AdminSection::pick_port}),
      StringField("admin", "token",
                  Member<AdminSection, std::string>{&D::admin, &AdminSection::token}),
      StringField("admin", "token_file",
                  Member<AdminSection, std::string>{&D::admin, &AdminSection::token_file}),

      StringField("control", "coordinator_secret_key_file",
                  Member<ControlSection, std::string>{
                      &D::control, &ControlSection::coordinator_secret_key_file}),
      StringListField("control", "worker_public_keys",
                      Member<ControlSection, std::vector<std::string>>{
                          &D::control, &ControlSection::worker_public_keys}),
      StringField("control", "worker_secret_key_file",
                  Member<ControlSection, std::string>{&D::control,
                                                      &ControlSection::worker_secret_key_file}),
      StringField("control", "coordinator_public_key",
                  Member<ControlSection, std::string>{&D::control,
                                                      &ControlSection::coordinator_public_key}),
      BoolField("control", "allow_unauthenticated",
                Member<ControlSection, bool>{&D::control, &ControlSection::allow_unauthenticated}),

      IntField("store", "max_frame_bytes",
               Member<StoreSection, int64_t>{&D::store, &StoreSection::max_frame_bytes}),
      IntField("store", "max_connections",
               Member<StoreSection, int>{&D::store, &StoreSection::max_connections}),
      IntField("store", "max_keys",
               Member<StoreSection, int64_t>{&D::store, &StoreSection::max_keys}),
      IntField("store", "max_bytes",
               Member<StoreSection, int64_t>{&D::store, &StoreSection::max_bytes}),
      NumberField(
          "store", "handshake_timeout_seconds",
          Member<StoreSection, double>{&D::store, &StoreSection::handshake_timeout_seconds}),

      EnumField("logging", "level",
                Member<LoggingSection, LogLevel>{&D::logging, &LoggingSection::level},
                LogLevelChoices()),
      EnumField("logging", "format",
                Member<LoggingSection, LogFormat>{&D::logging, &LoggingSection::format},
                LogFormatChoices()),

      StringField("worker", "coordinator",
                  Member<WorkerSection, std::string>{&D::worker, &WorkerSection::coordinator}),
      IntField("worker", "device", Member<WorkerSection, int>{&D::worker, &WorkerSection::device}),
      EnumField("worker", "backend",
                Member<WorkerSection, WorkerBackend>{&D::worker, &WorkerSection::backend},
                WorkerBackendChoices()),
      StringField("worker", "host",
                  Member<WorkerSection, std::string>{&D::worker, &WorkerSection::host}),
      StringField("worker", "gloo_host",
                  Member<WorkerSection, std::string>{&D::worker, &WorkerSection::gloo_host}),
      StringField("worker", "topology_file",
                  Member<WorkerSection, std::string>{&D::worker, &WorkerSection::topology_file}),
      StringField("worker", "metrics_host",
                  Member<WorkerSection, std::string>{&D::worker, &WorkerSection::metrics_host}),
      IntField("worker", "metrics_port",
               Member<WorkerSection, int>{&D::worker, &WorkerSection::metrics_port}),

      StringField("structured_output", "llguidance_library",
                  Member<StructuredOutputSection, std::string>{
                      &D::structured_output, &StructuredOutputSection::llguidance_library}),
      StringField("structured_output", "python_library",
                  Member<StructuredOutputSection, std::string>{
                      &D::structured_output, &StructuredOutputSection::python_library}),
  };
  return fields;
}

bool IsTable(const std::string& table) {
  const auto& t = Tables();
  return std::find(t.begin(), t.end(), table) != t.end();
}

const Field* FindField(const std::string& table, const std::string& key) {
  for (const Field& f : Fields()) {
    if (f.table == table && f.key == key) return &f;
  }
  return nullptr;
}

// "; did you mean 'x'?" when one valid name is close to `name`, else "".
std::string DidYouMean(const std::string& name, const std::vector<std::string>& valid) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& v : valid) {
    if (name.size() >= 3 && v.rfind(name, 0) == 0)
      return "; did you mean '" + v + "'?";  // a prefix
  }
  for (const auto& v : valid) {
    size_t d = EditDistance(name, v);
    if (d < best_d) best_d = d, best = v;
  }
  if (best_d <= std::max<size_t>(2, name.size() / 3)) return "; did you mean '" + best + "'?";
  return "";
}

std::string UnknownTableMessage(const std::string& table) {
  std::string msg = "unknown table '" + table + "'" + DidYouMean(table, Tables());
  std::vector<std::string> owners;
  for (const Field& f : Fields()) {
    if (f.key == table) owners.push_back("[" + f.table + "]");
  }
  if (!owners.empty()) msg += fmt::format("; '{}' is a key of {}", table, fmt::join(owners, ", "));
  return msg + fmt::format("; valid tables: {}", fmt::join(Tables(), ", "));
}

std::string UnknownKeyMessage(const std::string& table, const std::string& key) {
  std::vector<std::string> valid;
  for (const Field& f : Fields()) {
    if (f.table == table) valid.push_back(f.key);
  }
  return "unknown key" + DidYouMean(key, valid) +
         fmt::format("; valid keys of [{}]: {}", table, fmt::join(valid, ", "));
}

}  // namespace config_internal

// ---------------------------------------------------------------------------
// The enum names of daemon_config.h.

using config_internal::ChoiceName;
using config_internal::LogFormatChoices;
using config_internal::LogLevelChoices;
using config_internal::ParallelModeChoices;
using config_internal::ParallelObjectiveChoices;
using config_internal::WorkerBackendChoices;

const char* LogLevelName(LogLevel level) { return ChoiceName(LogLevelChoices(), level); }
const char* LogFormatName(LogFormat format) { return ChoiceName(LogFormatChoices(), format); }
const char* ParallelModeName(ParallelMode mode) { return ChoiceName(ParallelModeChoices(), mode); }
const char* ParallelObjectiveName(ParallelObjective objective) {
  return ChoiceName(ParallelObjectiveChoices(), objective);
}
const char* WorkerBackendName(WorkerBackend backend) {
  return ChoiceName(WorkerBackendChoices(), backend);
}

}  // namespace tessera
