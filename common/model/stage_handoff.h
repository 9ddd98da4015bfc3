// Stage handoff: which rank of pipeline stage s sends the hidden state to
// which rank of stage s+1 when the two stages have different tp (a host of
// 8 GPUs at tp=8 feeding a host of 4 at tp=4, as the placement planner may
// choose for mixed fleets).
//
// Between stages the hidden state [tokens, hidden] is replicated on every tp
// rank (the row-parallel all-reduce leaves each rank the full sum), so any
// sender rank can serve any receiver. The pairing spreads receivers evenly
// over senders:
//
//   receiver j of the next stage gets it from sender  j % tp_from
//   sender i sends to receivers                        { j : j % tp_from == i, 0 <= j < tp_to }
//
// With tp_from == tp_to this is ParallelConfig's "same tp_rank" pipeline.
// With tp_to < tp_from, senders tp_to .. tp_from-1 send nothing; with
// tp_to > tp_from each sender serves floor or ceil of tp_to / tp_from
// receivers. The planner uses the same pairing to cost a hop.
//
// Thread-safety: pure functions.
#pragma once

#include <vector>

namespace tessera {

// The sender tp rank of receiver `receiver` (0 <= receiver < tp_to).
// Preconditions: tp_from >= 1, tp_to >= 1.
int HandoffSender(int receiver, int tp_from, int tp_to);
// The receiver tp ranks of sender `sender` (0 <= sender < tp_from),
// ascending; empty when it sends nothing.
std::vector<int> HandoffReceivers(int sender, int tp_from, int tp_to);

}  // namespace tessera
