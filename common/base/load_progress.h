// Progress of a shard load, as one log line: bytes done / total, percent and
// rate, e.g.
//   "loading worker w1 rank 2: 312.0 MB / 540.1 MB (57.8%), 95.3 MB/s"
// LoadProgressLog writes it at most every `interval_seconds` and once at
// 100%, so a load of any size logs a handful of lines.
//
// Thread-safety: FormatLoadProgress is pure; a LoadProgressLog is used by one
// thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tessera {

// "<done> MB / <total> MB (<pct>%), <rate> MB/s" (MB = 1e6 bytes; rate over
// `seconds`, omitted when seconds <= 0; percent omitted when total <= 0).
std::string FormatLoadProgress(int64_t bytes_done, int64_t bytes_total, double seconds);

class LoadProgressLog {
 public:
  explicit LoadProgressLog(std::string who, double interval_seconds = 2.0);
  // Reports that `bytes_done` of `bytes_total` are loaded; logs at info level
  // when interval_seconds passed since the last line, or when done == total.
  void Update(int64_t bytes_done, int64_t bytes_total);

 private:
  const std::string who_;
  const double interval_seconds_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
  bool logged_done_ = false;
};

}  // namespace tessera
