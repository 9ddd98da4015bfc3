#include "common/base/logging.h"

#include <fmt/chrono.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera {
namespace {

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kCritical:
      return spdlog::level::critical;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

// The process's one logger: stderr, thread-safe sink, created on first use.
spdlog::logger& Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> existing = spdlog::get("tessera");
    return existing ? existing : spdlog::stderr_color_mt("tessera");
  }();
  return *logger;
}

struct Tags {
  std::mutex mu;
  std::string node;                         // protected by mu
  int rank = -1, stage = -1, tp_rank = -1;  // protected by mu
  std::string text;                         // "[node=.. rank=..] " or ""; protected by mu
  std::atomic<bool> json{false};
};

Tags& GetTags() {
  static Tags tags;
  return tags;
}

void RebuildText(Tags& t) {
  std::string s;
  if (!t.node.empty()) s += "node=" + t.node;
  if (t.rank >= 0) {
    if (!s.empty()) s += ' ';
    s += fmt::format("rank={} stage={} tp_rank={}", t.rank, t.stage, t.tp_rank);
  }
  t.text = s.empty() ? "" : "[" + s + "] ";
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "trace";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kCritical:
      return "critical";
    case LogLevel::kOff:
      return "off";
  }
  return "info";
}

}  // namespace

void SetLogJson(bool json) {
  Tags& t = GetTags();
  t.json.store(json);
  Logger().set_pattern(json ? "%v" : "%+");
}

void SetLogNode(std::string_view node) {
  Tags& t = GetTags();
  std::lock_guard<std::mutex> lock(t.mu);
  t.node = std::string(node);
  RebuildText(t);
}

void SetLogRank(int rank, int stage, int tp_rank) {
  Tags& t = GetTags();
  std::lock_guard<std::mutex> lock(t.mu);
  t.rank = rank;
  t.stage = stage;
  t.tp_rank = tp_rank;
  RebuildText(t);
}

StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  if (name == "trace") return LogLevel::kTrace;
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "critical") return LogLevel::kCritical;
  if (name == "off") return LogLevel::kOff;
  return InvalidArgument("log level '" + std::string(name) +
                         "' is not one of trace, debug, info, warn, error, off");
}

void SetLogLevel(LogLevel level) { Logger().set_level(ToSpdlog(level)); }

bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff && Logger().should_log(ToSpdlog(level));
}

void LogLine(LogLevel level, std::string_view subsystem, std::string_view message) {
  Tags& t = GetTags();
  if (!t.json.load()) {
    std::string tags;
    {
      std::lock_guard<std::mutex> lock(t.mu);
      tags = t.text;
    }
    Logger().log(ToSpdlog(level), "{}[{}] {}", tags, subsystem, message);
    return;
  }
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  nlohmann::ordered_json j;
  j["time"] =
      fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03d}Z",
                  fmt::gmtime(std::chrono::system_clock::to_time_t(now)), static_cast<int>(ms));
  j["level"] = LevelName(level);
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (!t.node.empty()) j["node"] = t.node;
    if (t.rank >= 0) {
      j["rank"] = t.rank;
      j["stage"] = t.stage;
      j["tp_rank"] = t.tp_rank;
    }
  }
  j["subsystem"] = std::string(subsystem);
  j["message"] = std::string(message);
  // Invalid UTF-8 in a message is replaced rather than thrown on.
  Logger().log(ToSpdlog(level), "{}",
               j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

}  // namespace tessera
