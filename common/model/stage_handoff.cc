#include "common/model/stage_handoff.h"

#include "common/base/status.h"

namespace tessera {

int HandoffSender(int receiver, int tp_from, int tp_to) {
  TESSERA_CHECK(tp_from >= 1 && tp_to >= 1 && receiver >= 0 && receiver < tp_to);
  return receiver % tp_from;
}

std::vector<int> HandoffReceivers(int sender, int tp_from, int tp_to) {
  TESSERA_CHECK(tp_from >= 1 && tp_to >= 1 && sender >= 0 && sender < tp_from);
  std::vector<int> out;
  for (int j = sender; j < tp_to; j += tp_from) out.push_back(j);
  return out;
}

}  // namespace tessera
