// Logging: one line per event, tagged with the subsystem that wrote it, over
// one spdlog logger named "tessera" on stderr. Two formats:
//   text: "[time] [tessera] [level] [node=h1 rank=2 stage=1 tp_rank=0] [subsystem] message"
//   json: {"time":"2026-01-02T03:04:05.678Z","level":"info","node":"h1","rank":2,
//          "stage":1,"tp_rank":0,"subsystem":"worker","message":"..."}
//         one object per line, for log shippers (Loki, Fluent Bit, Vector).
// The node/rank tags appear once set (SetLogNode, SetLogRank).
//
//   TESSERA_LOG_WARN("control-server", "dropped message from peer {}: {}", peer, reason);
//
// The macros check the level before formatting, so a disabled line costs one
// comparison. Arguments use fmt syntax.
//
// Thread-safety: every function and macro may be called from any thread.
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "common/base/status.h"

namespace tessera {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };

// Parses "trace", "debug", "info", "warn", "error" or "off" (the config
// file's log_level). Errors: kInvalidArgument naming the string and listing
// the accepted ones.
StatusOr<LogLevel> ParseLogLevel(std::string_view name);

// Sets the process-wide level; lines below it are skipped. Default: kInfo.
void SetLogLevel(LogLevel level);

// Writes JSON objects instead of text lines (--log-format json).
void SetLogJson(bool json);

// Tags every later line with this process's node (host name) and, once a
// worker has its assignment, its world rank, pipeline stage and tp rank.
void SetLogNode(std::string_view node);
void SetLogRank(int rank, int stage, int tp_rank);

// Whether a line at `level` is written.
bool LogEnabled(LogLevel level);

// Writes "[subsystem] message" at `level` (no level check; use the macros).
void LogLine(LogLevel level, std::string_view subsystem, std::string_view message);

}  // namespace tessera

#define TESSERA_LOG(level, subsystem, ...)                              \
  do {                                                                  \
    if (::tessera::LogEnabled(level))                                   \
      ::tessera::LogLine(level, subsystem, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define TESSERA_LOG_TRACE(subsystem, ...) \
  TESSERA_LOG(::tessera::LogLevel::kTrace, subsystem, __VA_ARGS__)
#define TESSERA_LOG_DEBUG(subsystem, ...) \
  TESSERA_LOG(::tessera::LogLevel::kDebug, subsystem, __VA_ARGS__)
#define TESSERA_LOG_INFO(subsystem, ...) \
  TESSERA_LOG(::tessera::LogLevel::kInfo, subsystem, __VA_ARGS__)
#define TESSERA_LOG_WARN(subsystem, ...) \
  TESSERA_LOG(::tessera::LogLevel::kWarn, subsystem, __VA_ARGS__)
#define TESSERA_LOG_ERROR(subsystem, ...) \
  TESSERA_LOG(::tessera::LogLevel::kError, subsystem, __VA_ARGS__)
