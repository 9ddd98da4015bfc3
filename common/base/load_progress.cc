#include "common/base/load_progress.h"

#include <fmt/format.h>

#include "common/base/logging.h"

namespace tessera {

std::string FormatLoadProgress(int64_t bytes_done, int64_t bytes_total, double seconds) {
  std::string s = fmt::format("{:.1f} MB", static_cast<double>(bytes_done) / 1e6);
  if (bytes_total > 0)
    s += fmt::format(" / {:.1f} MB ({:.1f}%)", static_cast<double>(bytes_total) / 1e6,
                     100.0 * static_cast<double>(bytes_done) / static_cast<double>(bytes_total));
  if (seconds > 0)
    s += fmt::format(", {:.1f} MB/s", static_cast<double>(bytes_done) / 1e6 / seconds);
  return s;
}

LoadProgressLog::LoadProgressLog(std::string who, double interval_seconds)
    : who_(std::move(who)),
      interval_seconds_(interval_seconds),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void LoadProgressLog::Update(int64_t bytes_done, int64_t bytes_total) {
  const auto now = std::chrono::steady_clock::now();
  const bool done = bytes_total > 0 && bytes_done >= bytes_total;
  if (done ? logged_done_ : std::chrono::duration<double>(now - last_).count() < interval_seconds_)
    return;
  last_ = now;
  logged_done_ = done;
  TESSERA_LOG_INFO("load", "loading {}: {}", who_,
                   FormatLoadProgress(bytes_done, bytes_total,
                                      std::chrono::duration<double>(now - start_).count()));
}

}  // namespace tessera
