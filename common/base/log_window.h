// LogWindow: at most `burst` log lines of one kind a minute, so a flood of
// the same event (refused handshakes, registrations refused for a key in
// use) cannot flood the log; the rest are counted, and the count is reported
// in one line when the next minute's first event arrives.
//
// Thread-safety: none; one thread (the caller's) owns a window.
#pragma once

#include <chrono>
#include <cstdint>

namespace tessera {

class LogWindow {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogWindow(int burst) : burst_(burst) {}

  struct Verdict {
    bool log = false;     // log this event
    bool last = false;    // it is the last one logged this minute (say so)
    uint64_t missed = 0;  // events not logged in the minute that just ended (report first)
  };

  // One event at `now`.
  Verdict Admit(Clock::time_point now) {
    Verdict v;
    if (now - start_ >= std::chrono::minutes(1)) {
      v.missed = unlogged_;
      start_ = now;
      logged_ = 0;
      unlogged_ = 0;
    }
    if (logged_ < burst_) {
      ++logged_;
      v.log = true;
      v.last = logged_ == burst_;
    } else {
      ++unlogged_;
    }
    return v;
  }

 private:
  const int burst_;
  Clock::time_point start_{};
  int logged_ = 0;
  uint64_t unlogged_ = 0;
};

}  // namespace tessera
