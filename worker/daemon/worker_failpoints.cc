#include "worker/daemon/worker_failpoints.h"

#include <cstdlib>

namespace tessera {

StatusOr<WorkerFailpoints> ParseWorkerFailpoints(const char* ignore_assign,
                                                 const char* step_sleep) {
  WorkerFailpoints f;
  if (ignore_assign) {
    const std::string v = ignore_assign;
    if (v != "0" && v != "1" && v != "first")
      return InvalidArgument("TESSERA_FAILPOINT_IGNORE_ASSIGN: expected 0, 1 or first, got '" + v +
                             "'");
    f.ignore_assignments = v == "1";
    f.ignore_first_assignment = v == "first";
  }
  if (step_sleep) {
    const std::string v = step_sleep;
    const size_t a = v.find(':'), b = a == std::string::npos ? a : v.find(':', a + 1);
    char* end = nullptr;
    if (b != std::string::npos) {
      // strtol/strtod leave `end` inside their argument: the parts stay alive while it is read.
      const std::string rank = v.substr(0, a), seconds = v.substr(a + 1, b - a - 1);
      f.step_sleep_rank = static_cast<int>(std::strtol(rank.c_str(), &end, 10));
      const bool rank_ok = a > 0 && *end == '\0' && f.step_sleep_rank >= 0;
      f.step_sleep_seconds = std::strtod(seconds.c_str(), &end);
      f.step_sleep_trigger = v.substr(b + 1);
      if (rank_ok && *end == '\0' && f.step_sleep_seconds > 0 && !f.step_sleep_trigger.empty())
        return f;
    }
    return InvalidArgument(
        "TESSERA_FAILPOINT_STEP_SLEEP: expected RANK:SECONDS:TRIGGER_FILE (rank >= 0, seconds > "
        "0), got '" +
        v + "'");
  }
  return f;
}

}  // namespace tessera
