// ProcessGroup: the communicators one rank needs for tensor + pipeline
// parallel inference, built from (tp, pp, world rank) and a rendezvous Store.
//
// Layout (common/parallel_rank.h): world_rank = stage * tp + tp_rank.
//  - tp(): the tensor-parallel group of this rank's stage, group name
//    "tp.stage<k>", ranks = tp ranks 0..tp-1 of stage k (world ranks
//    k*tp .. k*tp+tp-1). Column-/row-parallel layers all-reduce here. A group
//    of size 1 when tp == 1 (its collectives are no-ops).
//  - next_stage() / prev_stage(): point-to-point "pipe" links between
//    pipeline stages. There is one 2-rank pipe group per (stage s, tp rank t),
//    named "pipe.stage<s>-<s+1>.tp<t>", joining world ranks (s, t) and
//    (s+1, t); within it, the earlier stage is rank 0 (kPipeEarlierRank) and
//    the later stage rank 1 (kPipeLaterRank). After a stage's row-parallel
//    all-reduce every tp rank holds the same (replicated) hidden state, so
//    each tp rank forwards its own copy to its counterpart in the next stage:
//    tp links run in parallel, nothing is gathered or scattered, and a rank
//    only ever talks to ranks with its own tp_rank across stages.
//    prev_stage() is null on stage 0, next_stage() on the last stage.
//
// Create builds the tp group first, then the link to the previous stage,
// then the link to the next one; since stage 0 has no previous link the
// rendezvous proceeds stage by stage and cannot deadlock.
//
// Thread-safety: as Communicator; the accessors are const and thread-safe.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "common/store.h"
#include "worker/communicator.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace tessera {

struct ProcessGroupOptions {
  int tp = 1;                             // tensor-parallel ranks per stage
  int pp = 1;                             // pipeline stages
  int world_rank = 0;                     // this process, 0 <= world_rank < tp * pp
  double timeout_seconds = 30.0;          // bound of every communicator call
  double connect_timeout_seconds = 60.0;  // bound of each group's rendezvous
  std::string hostname = "127.0.0.1";     // address this rank's TCP device binds to
  std::string iface;                      // or: the interface it binds to
  // Prepended as "<key_prefix>/" to every group name (and so to the store
  // keys), to keep several deployments or restarts apart on one store.
  std::string key_prefix;
};

class ProcessGroup {
 public:
  static constexpr int kPipeEarlierRank = 0;  // rank of stage s in pipe group s -> s+1
  static constexpr int kPipeLaterRank = 1;    // rank of stage s+1 in that group
  static constexpr int kReturnFirstRank = 0;  // stage 0 in the return group
  static constexpr int kReturnLastRank = 1;   // the last stage in the return group

  // Joins the tp group and the pipe links of options.world_rank. Blocks until
  // the ranks it connects to have joined too.
  // Errors: kInvalidArgument (tp, pp or world_rank out of range), and the
  // errors of GlooCommunicator::Create (kDeadlineExceeded naming the group
  // and the missing rank's store key, kUnavailable).
  static StatusOr<std::unique_ptr<ProcessGroup>> Create(Store& store,
                                                        const ProcessGroupOptions& options);

  ~ProcessGroup();

  int tp_size() const { return options_.tp; }
  int pp_size() const { return options_.pp; }
  int world_size() const { return options_.tp * options_.pp; }
  int world_rank() const { return options_.world_rank; }
  int stage() const { return stage_; }
  int tp_rank() const { return tp_rank_; }
  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return stage_ == options_.pp - 1; }

  // The tp group of this stage; never null.
  Communicator* tp() const { return tp_.get(); }
  // The pipe link to stage - 1 (this rank is kPipeLaterRank in it); null on
  // stage 0.
  Communicator* prev_stage() const { return prev_.get(); }
  // The pipe link to stage + 1 (this rank is kPipeEarlierRank in it); null on
  // the last stage.
  Communicator* next_stage() const { return next_.get(); }
  // The 2-rank "return" group joining this tp rank of the last stage to the
  // same tp rank of stage 0, for sampled tokens; null when pp == 1 and on
  // middle stages.
  Communicator* return_link() const { return ret_.get(); }

  // Sends `bytes` bytes (e.g. the hidden state, float32[tokens, hidden]) to
  // this tp rank's counterpart in stage + 1. Errors: kFailedPrecondition on
  // the last stage; otherwise as Communicator::Send.
  Status SendToNextStage(const void* data, size_t bytes);
  // Receives `bytes` bytes from this tp rank's counterpart in stage - 1.
  // Errors: kFailedPrecondition on stage 0; otherwise as Communicator::Recv.
  Status RecvFromPrevStage(void* data, size_t bytes);

 private:
  explicit ProcessGroup(const ProcessGroupOptions& options);

  const ProcessGroupOptions options_;
  const int stage_;
  const int tp_rank_;
  std::shared_ptr<gloo::transport::Device> device_;  // shared by the communicators below
  std::unique_ptr<Communicator> tp_;
  std::unique_ptr<Communicator> prev_;
  std::unique_ptr<Communicator> next_;
  std::unique_ptr<Communicator> ret_;
};

}  // namespace tessera
