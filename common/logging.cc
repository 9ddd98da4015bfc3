#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
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

}  // namespace

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
  Logger().log(ToSpdlog(level), "[{}] {}", subsystem, message);
}

}  // namespace tessera
