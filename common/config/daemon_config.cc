#include "common/config/daemon_config.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "common/net/curve_keys.h"
#include "common/net/host_address.h"

namespace tessera {

namespace {
// Input bounds of [parallel]: a tp or pp, and the ranks of a layout.
constexpr int kMaxLayoutDegree = 1 << 16;
constexpr int64_t kMaxLayoutRanks = 1 << 20;
}  // namespace

namespace {

// ---------------------------------------------------------------------------
// Locations and value rendering for error messages.

std::string Loc(const toml::source_region& r, const std::string& path) {
  return fmt::format("{}:{}:{}", path, r.begin.line, r.begin.column);
}

// A TOML basic string literal for `s` (always double-quoted, escaped).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string FormatDouble(double d);

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

// Where a node came from: a file location, or the --set flag for overrides.
using Locator = std::function<std::string(const toml::node&)>;

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

struct Field {
  std::string table;
  std::string key;
  std::string expected;  // "an integer", "a string", ... for messages
  bool is_string;        // overrides take the value verbatim
  // Reads `node` into the config. `key` is "table.key".
  std::function<Status(DaemonConfig&, const toml::node&, const Locator&)> set;
  // The current value as a TOML literal.
  std::function<std::string(const DaemonConfig&)> format;

  std::string path() const { return table + "." + key; }
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

template <typename S>
Field IntListField(const char* table, const char* key, Member<S, std::vector<int>> m) {
  std::string full = std::string(table) + "." + key;
  return Field{
      table,
      key,
      "an array of integers",
      false,
      [m, full](DaemonConfig& c, const toml::node& n, const Locator& loc) -> Status {
        if (!n.is_array()) {
          return KeyError(loc(n), full, "expected an array of integers, got " + Show(n));
        }
        std::vector<int> values;
        const toml::array& arr = *n.as_array();
        for (size_t i = 0; i < arr.size(); ++i) {
          int v = 0;
          TESSERA_RETURN_IF_ERROR(ReadInt<int>(arr[i], loc, fmt::format("{}[{}]", full, i), &v));
          values.push_back(v);
        }
        m(c) = std::move(values);
        return Status::Ok();
      },
      [m](const DaemonConfig& c) { return fmt::format("[{}]", fmt::join(m(c), ", ")); }};
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
        if (n.is_integer()) {
          int v = 0;
          TESSERA_RETURN_IF_ERROR(ReadInt<int>(n, loc, full, &v));
          c.parallel.tp = v;
          c.parallel.tp_per_stage.clear();
          return Status::Ok();
        }
        if (!n.is_array()) {
          return KeyError(
              loc(n), full,
              "expected an integer or an array of integers (one per stage), got " + Show(n));
        }
        std::vector<int> values;
        const toml::array& arr = *n.as_array();
        if (arr.empty()) return KeyError(loc(n), full, "expected one entry per stage, got []");
        for (size_t i = 0; i < arr.size(); ++i) {
          int v = 0;
          TESSERA_RETURN_IF_ERROR(ReadInt<int>(arr[i], loc, fmt::format("{}[{}]", full, i), &v));
          values.push_back(v);
        }
        c.parallel.tp = 0;
        c.parallel.tp_per_stage = std::move(values);
        return Status::Ok();
      },
      [](const DaemonConfig& c) {
        return c.parallel.tp_per_stage.empty()
                   ? std::to_string(c.parallel.tp)
                   : fmt::format("[{}]", fmt::join(c.parallel.tp_per_stage, ", "));
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
  static const std::vector<std::string> t = {"model",    "parallel",  "server", "heartbeat",
                                             "kv_cache", "scheduler", "admin",  "control",
                                             "store",    "logging",   "worker"};
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
      EnumField(
          "parallel", "objective",
          Member<ParallelSection, ParallelObjective>{&D::parallel, &ParallelSection::objective},
          ParallelObjectiveChoices()),

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

      NumberField(
          "heartbeat", "interval_seconds",
          Member<HeartbeatSection, double>{&D::heartbeat, &HeartbeatSection::interval_seconds}),
      NumberField(
          "heartbeat", "timeout_seconds",
          Member<HeartbeatSection, double>{&D::heartbeat, &HeartbeatSection::timeout_seconds}),
      NumberField("heartbeat", "forget_failed_after_seconds",
                  Member<HeartbeatSection, double>{&D::heartbeat,
                                                   &HeartbeatSection::forget_failed_after_seconds}),

      NumberField("kv_cache", "memory_fraction",
                  Member<KvCacheSection, double>{&D::kv_cache, &KvCacheSection::memory_fraction}),
      IntField("kv_cache", "block_size",
               Member<KvCacheSection, int>{&D::kv_cache, &KvCacheSection::block_size}),
      IntField("kv_cache", "max_blocks",
               Member<KvCacheSection, int64_t>{&D::kv_cache, &KvCacheSection::max_blocks}),

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
      IntField(
          "scheduler", "max_prompt_tokens",
          Member<SchedulerSection, int64_t>{&D::scheduler, &SchedulerSection::max_prompt_tokens}),
      IntField("scheduler", "max_completion_tokens",
               Member<SchedulerSection, int64_t>{&D::scheduler,
                                                 &SchedulerSection::max_completion_tokens}),
      NumberField("scheduler", "drain_timeout_seconds",
                  Member<SchedulerSection, double>{&D::scheduler,
                                                   &SchedulerSection::drain_timeout_seconds}),

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

// ---------------------------------------------------------------------------
// Validation helpers.

// Parsed, and names resolved: common/net/host_address.h.
bool IsLoopback(const std::string& host) { return IsLoopbackHost(host); }

bool IsWildcard(const std::string& host) {
  return host == "*" || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// A host name, IPv4 address or IPv6 address (bare or in brackets).
bool IsHost(const std::string& host) {
  if (host.empty() || host.size() > 253) return false;
  std::string_view h = host;
  if (h.front() == '[') {
    if (h.back() != ']' || h.size() < 3) return false;
    h = h.substr(1, h.size() - 2);
  }
  for (char ch : h) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' ||
          ch == ':')) {
      return false;
    }
  }
  return true;
}

// Parses "tcp://HOST:PORT". `allow_wildcard`: an endpoint to bind, whose
// HOST may be a wildcard and whose PORT may be 0 (the kernel picks one).
// Returns "" on success, else what is wrong.
std::string ParseTcpEndpoint(const std::string& endpoint, bool allow_wildcard, std::string* host,
                             int* port) {
  constexpr std::string_view kScheme = "tcp://";
  const std::string shape = "must be \"tcp://HOST:PORT\"";
  if (endpoint.rfind(kScheme, 0) != 0) return shape + ", got " + Quote(endpoint);
  std::string rest = endpoint.substr(kScheme.size());
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return shape + ", got " + Quote(endpoint);
  *host = rest.substr(0, colon);
  std::string port_text = rest.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return shape + " with a numeric PORT, got " + Quote(endpoint);
  }
  *port = std::stoi(port_text);
  const int lowest = allow_wildcard ? 0 : 1;
  if (*port < lowest || *port > 65535)
    return fmt::format("port must be in {}..65535, got {}", lowest, *port);
  if (*host == "*") {
    return allow_wildcard ? ""
                          : "must name a host to connect to, got the wildcard " + Quote(endpoint);
  }
  if (!IsHost(*host)) return "HOST must be a host name or IP address, got " + Quote(endpoint);
  if (!allow_wildcard && IsWildcard(*host)) {
    return "must name a host to connect to, got the wildcard " + Quote(endpoint);
  }
  return "";
}

// RFC 6750 b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
bool IsBearerToken(const std::string& token) {
  size_t i = 0;
  while (i < token.size() && (std::isalnum(static_cast<unsigned char>(token[i])) ||
                              (token[i] != '\0' && std::strchr("-._~+/", token[i]) != nullptr))) {
    ++i;
  }
  if (i == 0) return false;
  while (i < token.size() && token[i] == '=') ++i;
  return i == token.size();
}

// Where `key` was set: its source, else the file, else "(defaults)".
std::string Where(const DaemonConfig& c, const std::string& key) {
  auto it = c.sources.find(key);
  if (it != c.sources.end()) return it->second;
  return c.path.empty() ? "(defaults)" : c.path;
}

bool IsSet(const DaemonConfig& c, const std::string& key) { return c.sources.count(key) > 0; }

Status Bad(const DaemonConfig& c, const std::string& key, const std::string& what) {
  return KeyError(Where(c, key), key, what);
}

// How recently `key` was given: 2 by an override, 1 in the file, 0 default.
int Recency(const DaemonConfig& c, const std::string& key) {
  auto it = c.sources.find(key);
  if (it == c.sources.end()) return 0;
  return it->second.rfind("--set ", 0) == 0 ? 2 : 1;
}

// The layout key a too-large layout is blamed on: the one given last (a
// --set over the file), else the larger of tp and pp.
const char* LayoutKeyToBlame(const DaemonConfig& c) {
  const int tp_recency = Recency(c, "parallel.tp"), pp_recency = Recency(c, "parallel.pp");
  if (tp_recency != pp_recency) return tp_recency > pp_recency ? "parallel.tp" : "parallel.pp";
  int max_tp = c.parallel.tp;
  for (int t : c.parallel.tp_per_stage) max_tp = std::max(max_tp, t);
  return c.parallel.pp >= max_tp ? "parallel.pp" : "parallel.tp";
}

// Of two keys in a relation that fails, the one to blame: the one given last
// (an override over the file over a default); `dependent` on a tie.
std::string Blame(const DaemonConfig& c, const std::string& dependent, const std::string& other) {
  return Recency(c, other) > Recency(c, dependent) ? other : dependent;
}

Status CheckHost(const DaemonConfig& c, const std::string& key, const std::string& host) {
  if (!IsHost(host)) return Bad(c, key, "must be a host name or IP address, got " + Quote(host));
  return Status::Ok();
}

Status CheckPort(const DaemonConfig& c, const std::string& key, int port, bool zero_ok) {
  if ((port == 0 && zero_ok) || (port >= 1 && port <= 65535)) return Status::Ok();
  return Bad(c, key, fmt::format("must be in {}..65535, got {}", zero_ok ? 0 : 1, port));
}

// Port 0 is a port the kernel picks at bind time: never one already taken.
bool SameListener(const std::string& host_a, int port_a, const std::string& host_b, int port_b) {
  return port_a != 0 && port_a == port_b &&
         (host_a == host_b || IsWildcard(host_a) || IsWildcard(host_b));
}

// In "auto" mode with no mode named, setting tp, pp or layers_per_stage
// selects "explicit".
void InferParallelMode(DaemonConfig& c) {
  if (IsSet(c, "parallel.mode")) return;
  if (IsSet(c, "parallel.tp") || IsSet(c, "parallel.pp") || IsSet(c, "parallel.layers_per_stage")) {
    c.parallel.mode = ParallelMode::kExplicit;
  }
}

// worker.coordinator, when not set, follows a loopback or wildcard
// server.control_endpoint, so one file with a moved control port still
// connects the workers of that machine (a wildcard becomes 127.0.0.1). A
// control endpoint on another address is left alone: workers elsewhere name
// their route to it themselves, with CURVE keys.
void InferWorkerCoordinator(DaemonConfig& c) {
  if (IsSet(c, "worker.coordinator") || !IsSet(c, "server.control_endpoint")) return;
  std::string host;
  int port = 0;
  if (!ParseTcpEndpoint(c.server.control_endpoint, true, &host, &port).empty()) return;
  if (port == 0) return;  // picked when the coordinator binds: workers are told it
  if (IsWildcard(host)) host = "127.0.0.1";
  if (!IsLoopback(host)) return;
  c.worker.coordinator = fmt::format("tcp://{}:{}", host, port);
}

std::string Trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Reads the regular file `file` into `*text`; on failure returns why
// ("cannot read \"f\": No such file or directory"), else "".
std::string ReadRegularFile(const std::string& file, std::string* text) {
  // Token, certificate and key files are small; a device or a FIFO (e.g.
  // "/dev/zero") would never end.
  constexpr uintmax_t kMaxBytes = 1 << 20;
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) return Quote(file) + " is a directory";
  const auto status = std::filesystem::status(file, ec);
  if (!ec && status.type() != std::filesystem::file_type::regular)
    return Quote(file) + " is not a regular file";
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (!ec && size > kMaxBytes)
    return Quote(file) + fmt::format(" has {} bytes; the limit is {}", size, kMaxBytes);
  std::ifstream in(file, std::ios::binary);
  if (!in) return "cannot read " + Quote(file) + ": " + std::strerror(errno);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return "cannot read " + Quote(file);
  *text = ss.str();
  return "";
}

// Reads admin.token_file into admin.effective_token and checks that the TLS
// files can be read.
Status ResolveFiles(DaemonConfig& c) {
  c.admin.effective_token = c.admin.token;
  if (!c.admin.token_file.empty()) {
    const std::string& file = c.admin.token_file;
    std::string text;
    std::string why = ReadRegularFile(file, &text);
    if (!why.empty()) return Bad(c, "admin.token_file", why);
    std::string token = Trim(text);
    if (token.empty()) return Bad(c, "admin.token_file", Quote(file) + " is empty");
    if (!IsBearerToken(token)) {
      return Bad(c, "admin.token_file",
                 Quote(file) +
                     " does not hold a bearer token (letters, digits, - . _ ~ + / and trailing =)");
    }
    // Like a CURVE secret key file: a secret others on the host may read is
    // no secret.
    struct stat st;
    if (stat(file.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      return Bad(c, "admin.token_file",
                 Quote(file) + fmt::format(" is accessible by group or others (mode {:04o}); "
                                           "chmod 600 it (owner read/write only)",
                                           st.st_mode & 07777));
    }
    c.admin.effective_token = token;
  }
  for (const char* key : {"server.tls_cert", "server.tls_key"}) {
    const std::string& file =
        std::string(key) == "server.tls_cert" ? c.server.tls_cert : c.server.tls_key;
    if (file.empty()) continue;
    std::string text;
    std::string why = ReadRegularFile(file, &text);
    if (!why.empty()) return Bad(c, key, why);
  }
  return Status::Ok();
}

Status Finish(DaemonConfig& c) {
  TESSERA_RETURN_IF_ERROR(ValidateDaemonConfig(c));
  return ResolveFiles(c);
}

// Sets `table.key` = `value` from a --set flag on `c` (not validated).
Status SetOne(DaemonConfig& c, const std::string& dotted_key, const std::string& value) {
  const std::string flag = "--set " + dotted_key + "=" + value;
  size_t dot = dotted_key.find('.');
  std::string table = dotted_key.substr(0, dot);
  if (!IsTable(table)) return InvalidArgument(flag + ": " + UnknownTableMessage(table));
  if (dot == std::string::npos) {
    return InvalidArgument(flag + ": " + table + ": expected table.key, got the table alone");
  }
  std::string key = dotted_key.substr(dot + 1);
  const Field* f = FindField(table, key);
  if (f == nullptr) return KeyError(flag, dotted_key, UnknownKeyMessage(table, key));
  Locator loc = [&flag](const toml::node&) { return flag; };
  if (f->is_string) {
    TESSERA_RETURN_IF_ERROR(f->set(c, toml::value<std::string>(value), loc));
  } else {
    toml::table doc;
    try {
      doc = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      return KeyError(flag, dotted_key, "expected " + f->expected + ", got " + Quote(value));
    }
    if (doc.size() != 1) {
      return KeyError(flag, dotted_key, "expected " + f->expected + ", got " + Quote(value));
    }
    TESSERA_RETURN_IF_ERROR(f->set(c, *doc.get("v"), loc));
  }
  c.sources[dotted_key] = flag;
  if (dotted_key == "parallel.mode" && c.parallel.mode == ParallelMode::kAuto) {
    c.parallel.tp = 1;
    c.parallel.tp_per_stage.clear();
    c.parallel.pp = 1;
    c.parallel.layers_per_stage.clear();
    for (const char* k : {"parallel.tp", "parallel.pp", "parallel.layers_per_stage"})
      c.sources.erase(k);
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------

std::string ConfigKeyContext(const DaemonConfig& config, const std::string& key) {
  return Where(config, key) + ": " + key;
}

std::string ServedModelName(const ModelSection& model) {
  if (!model.name.empty()) return model.name;
  std::filesystem::path p(model.path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "models/x/" -> "models/x"
  std::string name = p.filename().string();
  return name.empty() ? model.path : name;
}

const char* LogLevelName(LogLevel level) { return ChoiceName(LogLevelChoices(), level); }
const char* LogFormatName(LogFormat format) { return ChoiceName(LogFormatChoices(), format); }
const char* ParallelModeName(ParallelMode mode) { return ChoiceName(ParallelModeChoices(), mode); }
const char* ParallelObjectiveName(ParallelObjective objective) {
  return ChoiceName(ParallelObjectiveChoices(), objective);
}
const char* WorkerBackendName(WorkerBackend backend) {
  return ChoiceName(WorkerBackendChoices(), backend);
}

StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound(path + ": config file does not exist");
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path + ": cannot open config file: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path + ": cannot read config file");
  return ParseDaemonConfig(ss.str(), path);
}

StatusOr<DaemonConfig> ParseDaemonConfig(const std::string& text, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return InvalidArgument(Loc(e.source(), path) +
                           ": TOML syntax error: " + std::string(e.description()));
  }
  DaemonConfig c;
  c.path = path;
  Locator loc = [&path](const toml::node& n) { return Loc(n.source(), path); };
  for (auto&& [tkey, tnode] : root) {
    std::string table(tkey.str());
    if (!IsTable(table))
      return InvalidArgument(Loc(tkey.source(), path) + ": " + UnknownTableMessage(table));
    if (!tnode.is_table())
      return KeyError(loc(tnode), table, "expected a table, got " + Show(tnode));
    for (auto&& [key, node] : *tnode.as_table()) {
      std::string name(key.str());
      const Field* f = FindField(table, name);
      if (f == nullptr) {
        return KeyError(Loc(key.source(), path), table + "." + name,
                        UnknownKeyMessage(table, name));
      }
      TESSERA_RETURN_IF_ERROR(f->set(c, node, loc));
      c.sources[f->path()] = loc(node);
    }
  }
  InferParallelMode(c);
  InferWorkerCoordinator(c);
  TESSERA_RETURN_IF_ERROR(Finish(c));
  return c;
}

Status ValidateDaemonConfig(const DaemonConfig& c) {
  // [model]
  if (c.model.path.empty()) return Bad(c, "model.path", "must name the model directory, got \"\"");

  // [parallel]
  const ParallelSection& par = c.parallel;
  if (par.workers < 0)
    return Bad(c, "parallel.workers", fmt::format("must be >= 0, got {}", par.workers));
  if (par.mode == ParallelMode::kAuto) {
    for (const char* key : {"parallel.tp", "parallel.pp", "parallel.layers_per_stage"}) {
      bool non_default =
          (std::string(key) == "parallel.tp" && (par.tp != 1 || !par.tp_per_stage.empty())) ||
          (std::string(key) == "parallel.pp" && par.pp != 1) ||
          (std::string(key) == "parallel.layers_per_stage" && !par.layers_per_stage.empty());
      if (IsSet(c, key) || non_default) {
        return Bad(c, key,
                   "is set but parallel.mode = \"auto\" (at " + Where(c, "parallel.mode") +
                       "); remove it, or set parallel.mode = \"explicit\"");
      }
    }
  } else {
    if (par.tp_per_stage.empty() && par.tp < 1)
      return Bad(c, "parallel.tp", fmt::format("must be >= 1, got {}", par.tp));
    if (par.pp < 1) return Bad(c, "parallel.pp", fmt::format("must be >= 1, got {}", par.pp));
    // Bounds on the input, far above any real layout, so that worker counts
    // fit an int (tp = pp = 65536 once wrapped to 0 workers).
    if (par.tp_per_stage.empty() && par.tp > kMaxLayoutDegree)
      return Bad(c, "parallel.tp",
                 fmt::format("must be at most {}, got {}", kMaxLayoutDegree, par.tp));
    if (par.pp > kMaxLayoutDegree)
      return Bad(c, "parallel.pp",
                 fmt::format("must be at most {}, got {}", kMaxLayoutDegree, par.pp));
    const auto& tps = par.tp_per_stage;
    if (!tps.empty()) {
      if (static_cast<int>(tps.size()) != par.pp) {
        return Bad(c, "parallel.tp",
                   fmt::format("must have one entry per stage (parallel.pp = {}), got {} "
                               "entries [{}]",
                               par.pp, tps.size(), fmt::join(tps, ", ")));
      }
      for (size_t i = 0; i < tps.size(); ++i) {
        if (tps[i] < 1) {
          return Bad(c, "parallel.tp",
                     fmt::format("entry {} (stage {}) must be >= 1, got {}", i, i, tps[i]));
        }
        if (tps[i] > kMaxLayoutDegree) {
          return Bad(c, "parallel.tp",
                     fmt::format("entry {} (stage {}) must be at most {}, got {}", i, i,
                                 kMaxLayoutDegree, tps[i]));
        }
      }
    }
    {
      int64_t ranks = 0;
      for (int s = 0; s < par.pp; ++s) ranks += par.TpOfStage(s);
      if (ranks > kMaxLayoutRanks) {
        return Bad(c, LayoutKeyToBlame(c),
                   fmt::format("the layout has {} ranks (the sum of every stage's tp); at most {}",
                               ranks, kMaxLayoutRanks));
      }
    }
    if (par.workers != 0 && par.workers != par.world_size())
      return Bad(c, "parallel.workers",
                 fmt::format("must be 0 or the layout's worker count {} in explicit mode, got {}",
                             par.world_size(), par.workers));
    const auto& layers = par.layers_per_stage;
    if (!layers.empty()) {
      if (static_cast<int>(layers.size()) != par.pp) {
        return Bad(
            c, "parallel.layers_per_stage",
            fmt::format("must have one entry per stage (parallel.pp = {}), got {} entries [{}]",
                        par.pp, layers.size(), fmt::join(layers, ", ")));
      }
      for (size_t i = 0; i < layers.size(); ++i) {
        if (layers[i] < 1) {
          return Bad(c, "parallel.layers_per_stage",
                     fmt::format("entry {} (stage {}) must be >= 1, got {}", i, i, layers[i]));
        }
      }
    }
  }

  // [server]
  const ServerSection& srv = c.server;
  TESSERA_RETURN_IF_ERROR(CheckHost(c, "server.host", srv.host));
  TESSERA_RETURN_IF_ERROR(CheckPort(c, "server.port", srv.port, true));
  std::string control_host;
  int control_port = 0;
  std::string why = ParseTcpEndpoint(srv.control_endpoint, true, &control_host, &control_port);
  if (!why.empty()) return Bad(c, "server.control_endpoint", why);
  if (srv.tls_cert.empty() != srv.tls_key.empty()) {
    const char* set = srv.tls_cert.empty() ? "server.tls_key" : "server.tls_cert";
    const char* missing = srv.tls_cert.empty() ? "server.tls_cert" : "server.tls_key";
    return Bad(c, set, std::string("is set but ") + missing + " is not; HTTPS needs both");
  }
  if (!(srv.read_timeout_seconds > 0) || !std::isfinite(srv.read_timeout_seconds)) {
    return Bad(c, "server.read_timeout_seconds",
               "must be a finite number > 0, got " + FormatDouble(srv.read_timeout_seconds));
  }
  if (srv.max_body_bytes < 1) {
    return Bad(c, "server.max_body_bytes", fmt::format("must be >= 1, got {}", srv.max_body_bytes));
  }
  if (srv.max_connections < 1) {
    return Bad(c, "server.max_connections",
               fmt::format("must be >= 1, got {}", srv.max_connections));
  }
  if (srv.max_header_count < 1) {
    return Bad(c, "server.max_header_count",
               fmt::format("must be >= 1, got {}", srv.max_header_count));
  }
  if (srv.max_streams < 1) {
    return Bad(c, "server.max_streams", fmt::format("must be >= 1, got {}", srv.max_streams));
  }
  if (srv.max_workers < 1) {
    return Bad(c, "server.max_workers", fmt::format("must be >= 1, got {}", srv.max_workers));
  }

  // [admin]
  const AdminSection& adm = c.admin;
  TESSERA_RETURN_IF_ERROR(CheckPort(c, "admin.port", adm.port, true));
  if (adm.pick_port && IsSet(c, "admin.port")) {
    return Bad(c, Blame(c, "admin.pick_port", "admin.port"),
               "admin.pick_port = true picks the admin listener's port and admin.port is set too; "
               "give one");
  }
  // A separate admin listener: admin.port, or a picked port.
  const bool separate_admin = adm.pick_port || adm.port != 0;
  if (separate_admin) {
    TESSERA_RETURN_IF_ERROR(CheckHost(c, "admin.host", adm.host));
    if (!adm.pick_port && SameListener(adm.host, adm.port, srv.host, srv.port)) {
      return Bad(
          c, Blame(c, "admin.port", "server.port"),
          fmt::format("the admin listener ({}:{}) and the API listener ({}:{}) are on one port; "
                      "use another port, or admin.port = 0 to serve the admin API on the API "
                      "listener",
                      adm.host, adm.port, srv.host, srv.port));
    }
  }
  if (SameListener(control_host, control_port, srv.host, srv.port)) {
    return Bad(c, "server.control_endpoint",
               fmt::format("{} is on the API listener's port ({}:{})", Quote(srv.control_endpoint),
                           srv.host, srv.port));
  }
  if (separate_admin && !adm.pick_port &&
      SameListener(control_host, control_port, adm.host, adm.port)) {
    return Bad(c, "server.control_endpoint",
               fmt::format("{} is on the admin listener's port ({}:{})",
                           Quote(srv.control_endpoint), adm.host, adm.port));
  }
  if (!adm.token.empty() && !adm.token_file.empty()) {
    return Bad(c, Blame(c, "admin.token_file", "admin.token"),
               "admin.token and admin.token_file are both set; give one");
  }
  if (!adm.token.empty() && !IsBearerToken(adm.token)) {
    return Bad(c, "admin.token",
               "must be a bearer token (letters, digits, - . _ ~ + / and trailing =), got " +
                   fmt::format("{} characters including invalid ones", adm.token.size()));
  }
  if (adm.token.empty() && adm.token_file.empty()) {
    const std::string& admin_host = separate_admin ? adm.host : srv.host;
    if (!IsLoopback(admin_host)) {
      const std::string key = separate_admin ? "admin.host" : "server.host";
      return Bad(
          c, key,
          Quote(admin_host) + " exposes the admin API beyond loopback" +
              (!separate_admin ? " (admin.port = 0 serves it on the API listener)" : "") +
              " without a token; set admin.token or admin.token_file, or give the admin API a "
              "loopback address");
    }
  }

  // [store]
  const StoreSection& st = c.store;
  if (st.max_frame_bytes < 4096 || st.max_frame_bytes > (int64_t{1} << 30))
    return Bad(c, "store.max_frame_bytes",
               fmt::format("must be in 4096..1073741824, got {}", st.max_frame_bytes));
  for (auto [key, v] :
       {std::pair<const char*, int64_t>{"store.max_connections", st.max_connections},
        {"store.max_keys", st.max_keys},
        {"store.max_bytes", st.max_bytes}})
    if (v < 1) return Bad(c, key, fmt::format("must be >= 1, got {}", v));
  if (!std::isfinite(st.handshake_timeout_seconds) || !(st.handshake_timeout_seconds > 0))
    return Bad(c, "store.handshake_timeout_seconds",
               "must be a finite number > 0, got " + FormatDouble(st.handshake_timeout_seconds));

  // [heartbeat]
  const HeartbeatSection& hb = c.heartbeat;
  if (!(hb.interval_seconds > 0) || !std::isfinite(hb.interval_seconds)) {
    return Bad(c, "heartbeat.interval_seconds",
               "must be a finite number > 0, got " + FormatDouble(hb.interval_seconds));
  }
  if (!(hb.timeout_seconds > 0) || !std::isfinite(hb.timeout_seconds)) {
    return Bad(c, "heartbeat.timeout_seconds",
               "must be a finite number > 0, got " + FormatDouble(hb.timeout_seconds));
  }
  if (hb.timeout_seconds <= hb.interval_seconds) {
    if (Blame(c, "heartbeat.timeout_seconds", "heartbeat.interval_seconds") ==
        "heartbeat.timeout_seconds") {
      return Bad(c, "heartbeat.timeout_seconds",
                 "must be > heartbeat.interval_seconds (" + FormatDouble(hb.interval_seconds) +
                     "), got " + FormatDouble(hb.timeout_seconds));
    }
    return Bad(c, "heartbeat.interval_seconds",
               "must be < heartbeat.timeout_seconds (" + FormatDouble(hb.timeout_seconds) +
                   "), got " + FormatDouble(hb.interval_seconds));
  }

  if (!(hb.forget_failed_after_seconds > 0) || !std::isfinite(hb.forget_failed_after_seconds)) {
    return Bad(c, "heartbeat.forget_failed_after_seconds",
               "must be a finite number > 0, got " + FormatDouble(hb.forget_failed_after_seconds));
  }

  // [kv_cache]
  const KvCacheSection& kv = c.kv_cache;
  if (!(kv.memory_fraction > 0 && kv.memory_fraction <= 1)) {
    return Bad(c, "kv_cache.memory_fraction",
               "must be in (0, 1], got " + FormatDouble(kv.memory_fraction));
  }
  if (kv.block_size < 1)
    return Bad(c, "kv_cache.block_size", fmt::format("must be >= 1, got {}", kv.block_size));
  if (kv.max_blocks < 0) {
    return Bad(c, "kv_cache.max_blocks",
               fmt::format("must be >= 0 (0 = no bound), got {}", kv.max_blocks));
  }

  // [scheduler]
  const SchedulerSection& s = c.scheduler;
  for (auto [key, v] :
       {std::pair<const char*, int64_t>{"scheduler.max_batch_tokens", s.max_batch_tokens},
        {"scheduler.max_sequences", s.max_sequences},
        {"scheduler.queue_limit", s.queue_limit},
        {"scheduler.prefill_chunk_tokens", s.prefill_chunk_tokens}}) {
    if (v < 1) return Bad(c, key, fmt::format("must be >= 1, got {}", v));
  }
  if (!(s.drain_timeout_seconds >= 0) || !std::isfinite(s.drain_timeout_seconds)) {
    return Bad(c, "scheduler.drain_timeout_seconds",
               "must be a finite number >= 0, got " + FormatDouble(s.drain_timeout_seconds));
  }
  if (s.max_context < 0) {
    return Bad(c, "scheduler.max_context",
               fmt::format("must be >= 0 (0 = the model's max_position_embeddings), got {}",
                           s.max_context));
  }
  for (auto [key, v] :
       {std::pair<const char*, int64_t>{"scheduler.max_prompt_tokens", s.max_prompt_tokens},
        {"scheduler.max_completion_tokens", s.max_completion_tokens}}) {
    if (v < 0) return Bad(c, key, fmt::format("must be >= 0 (0 = max_context alone), got {}", v));
  }
  for (auto [key, v] : {std::pair<const char*, int64_t>{"scheduler.max_sequences", s.max_sequences},
                        {"scheduler.prefill_chunk_tokens", s.prefill_chunk_tokens}}) {
    if (v <= s.max_batch_tokens) continue;
    if (Blame(c, key, "scheduler.max_batch_tokens") == key) {
      return Bad(
          c, key,
          fmt::format("must be <= scheduler.max_batch_tokens ({}), got {}", s.max_batch_tokens, v));
    }
    return Bad(c, "scheduler.max_batch_tokens",
               fmt::format("must be >= {} ({}), got {}", key, v, s.max_batch_tokens));
  }

  // [worker]
  const WorkerSection& w = c.worker;
  std::string coord_host;
  int coord_port = 0;
  why = ParseTcpEndpoint(w.coordinator, false, &coord_host, &coord_port);
  if (!why.empty()) return Bad(c, "worker.coordinator", why);

  // [control]
  const ControlSection& ctl = c.control;
  for (size_t i = 0; i < ctl.worker_public_keys.size(); ++i) {
    if (!IsZ85Key(ctl.worker_public_keys[i]))
      return Bad(c, "control.worker_public_keys",
                 fmt::format("entry {} must be a 40-character Z85 CURVE public key (tessera "
                             "keygen), got {}",
                             i, Quote(ctl.worker_public_keys[i])));
  }
  if (!ctl.coordinator_public_key.empty() && !IsZ85Key(ctl.coordinator_public_key))
    return Bad(c, "control.coordinator_public_key",
               "must be a 40-character Z85 CURVE public key (tessera keygen), got " +
                   Quote(ctl.coordinator_public_key));
  if (ctl.coordinator_secret_key_file.empty() != ctl.worker_public_keys.empty()) {
    if (ctl.worker_public_keys.empty())
      return Bad(c, "control.coordinator_secret_key_file",
                 "is set but control.worker_public_keys is empty: no worker could connect");
    return Bad(c, "control.worker_public_keys",
               "is set but control.coordinator_secret_key_file is not; CURVE needs the "
               "coordinator's secret key");
  }
  if (ctl.worker_secret_key_file.empty() != ctl.coordinator_public_key.empty()) {
    const char* set = ctl.worker_secret_key_file.empty() ? "control.coordinator_public_key"
                                                         : "control.worker_secret_key_file";
    const char* missing = ctl.worker_secret_key_file.empty() ? "control.worker_secret_key_file"
                                                             : "control.coordinator_public_key";
    return Bad(c, set, std::string("is set but ") + missing + " is not; CURVE needs both");
  }
  if (!IsLoopback(control_host) && ctl.coordinator_secret_key_file.empty())
    return Bad(c, "server.control_endpoint",
               Quote(srv.control_endpoint) +
                   " exposes the control plane beyond loopback without CURVE; set "
                   "control.coordinator_secret_key_file and control.worker_public_keys "
                   "(tessera keygen), or bind it to a loopback address");
  if (!IsLoopback(coord_host) && ctl.worker_secret_key_file.empty())
    return Bad(c, "worker.coordinator",
               Quote(w.coordinator) +
                   " is beyond loopback: the control plane needs CURVE; set "
                   "control.worker_secret_key_file and control.coordinator_public_key "
                   "(tessera keygen)");
  {
    // The workers the coordinator waits for must fit in its records.
    const int wanted =
        c.parallel.mode == ParallelMode::kExplicit ? c.parallel.world_size() : c.parallel.workers;
    // Blame what the operator set: the layout, unless max_workers was set
    // too (pp = 99 named server.max_workers, a key nobody had written).
    const bool explicit_layout = c.parallel.mode == ParallelMode::kExplicit;
    if (wanted > c.server.max_workers && IsSet(c, "server.max_workers"))
      return Bad(c, "server.max_workers",
                 fmt::format("must be >= the {} workers the coordinator waits for ({}), got {}",
                             explicit_layout ? "tp * pp" : "parallel.workers", wanted,
                             c.server.max_workers));
    if (wanted > c.server.max_workers) {
      const char* key = explicit_layout ? LayoutKeyToBlame(c) : "parallel.workers";
      return Bad(c, key,
                 fmt::format("the coordinator would wait for {} workers ({}), more than "
                             "server.max_workers ({}, its default) keeps records of; make the "
                             "layout smaller or raise server.max_workers",
                             wanted, explicit_layout ? "tp * pp" : "parallel.workers",
                             c.server.max_workers));
    }
  }
  if (w.device < 0) return Bad(c, "worker.device", fmt::format("must be >= 0, got {}", w.device));
  if (!w.host.empty()) TESSERA_RETURN_IF_ERROR(CheckHost(c, "worker.host", w.host));
  if (!w.gloo_host.empty()) TESSERA_RETURN_IF_ERROR(CheckHost(c, "worker.gloo_host", w.gloo_host));
  TESSERA_RETURN_IF_ERROR(CheckPort(c, "worker.metrics_port", w.metrics_port, true));
  if (w.metrics_port != 0) {
    TESSERA_RETURN_IF_ERROR(CheckHost(c, "worker.metrics_host", w.metrics_host));
    if (w.metrics_port + w.device > 65535) {
      return Bad(
          c, "worker.metrics_port",
          fmt::format("the worker listens on metrics_port + device = {} + {} = {}, above 65535",
                      w.metrics_port, w.device, w.metrics_port + w.device));
    }
  }
  return Status::Ok();
}

Status ApplyOverride(DaemonConfig& config, const std::string& dotted_key,
                     const std::string& value) {
  return ApplyOverrides(config, {dotted_key + "=" + value});
}

Status ApplyOverrides(DaemonConfig& config, const std::vector<std::string>& assignments) {
  DaemonConfig c = config;
  for (const std::string& a : assignments) {
    size_t eq = a.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--set " + a + ": expected table.key=value");
    }
    TESSERA_RETURN_IF_ERROR(SetOne(c, Trim(a.substr(0, eq)), a.substr(eq + 1)));
  }
  InferParallelMode(c);
  InferWorkerCoordinator(c);
  TESSERA_RETURN_IF_ERROR(Finish(c));
  config = std::move(c);
  return Status::Ok();
}

std::string FormatDaemonConfig(const DaemonConfig& config, bool redact_secrets) {
  std::string out;
  for (const std::string& table : Tables()) {
    out += (out.empty() ? "[" : "\n[") + table + "]\n";
    for (const Field& f : Fields()) {
      if (f.table != table) continue;
      const std::string path = f.path();
      if (config.parallel.mode == ParallelMode::kAuto &&
          (path == "parallel.tp" || path == "parallel.pp" || path == "parallel.layers_per_stage")) {
        continue;
      }
      std::string value = f.format(config);
      if (path == "admin.token" && redact_secrets && !config.admin.token.empty())
        value = "\"<redacted>\"";
      out += f.key + " = " + value + "\n";
    }
  }
  return out;
}

}  // namespace tessera
