#include "coordinator/serving/load_culprits.h"

#include <algorithm>
#include <climits>

namespace tessera {

namespace {

constexpr int kLoaded = 3;

}  // namespace

std::vector<std::string> LoadCulprits(const std::vector<RankLoadStage>& ranks,
                                      const std::string& reporter) {
  int lowest = INT_MAX, reporter_stage = -1;
  for (const RankLoadStage& r : ranks) {
    if (r.stage < kLoaded) lowest = std::min(lowest, r.stage);
    if (r.worker_id == reporter) reporter_stage = std::max(reporter_stage, r.stage);
  }
  std::vector<std::string> out;
  // A reporter at the lowest stage (or outside the plan) failed on its own.
  if (!reporter.empty() && (lowest == INT_MAX || reporter_stage <= lowest)) {
    out.push_back(reporter);
    return out;
  }
  for (const RankLoadStage& r : ranks)
    if (r.stage == lowest && std::find(out.begin(), out.end(), r.worker_id) == out.end())
      out.push_back(r.worker_id);
  return out;
}

const char* LoadStageShortfall(int stage) {
  switch (stage) {
    case 0:
      return "did not join its groups (never reached the rendezvous store)";
    case 1:
      return "did not start loading (its groups did not form)";
    case 2:
      return "did not finish loading";
    default:
      return "loaded";
  }
}

}  // namespace tessera
