// Logging: one line per event, tagged with the subsystem that wrote it, over
// one spdlog logger named "tessera" (stderr, "[time] [tessera] [level] [subsystem] message").
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

#include "common/status.h"

namespace tessera {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };

// Parses "trace", "debug", "info", "warn", "error" or "off" (the config
// file's log_level). Errors: kInvalidArgument naming the string and listing
// the accepted ones.
StatusOr<LogLevel> ParseLogLevel(std::string_view name);

// Sets the process-wide level; lines below it are skipped. Default: kInfo.
void SetLogLevel(LogLevel level);

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
