// ProcessGroup: the communicators one rank needs for tensor + pipeline
// parallel inference, built from (tp per stage, pp, world rank) and a
// rendezvous Store.
//
// Layout (common/model/parallel_rank.h): world_rank = (sum of the tp of earlier
// stages) + tp_rank; stage * tp + tp_rank when every stage has the same tp.
//  - tp(): the tensor-parallel group of this rank's stage, group name
//    "tp.stage<k>", ranks = tp ranks 0..tp_k-1 of stage k (consecutive world
//    ranks). Column-/row-parallel layers all-reduce here. A group of size 1
//    when the stage has tp == 1 (its collectives are no-ops).
//  - Pipe links between consecutive stages: one 2-rank group per (sender tp
//    rank i of stage s, receiver tp rank j of stage s+1) pair, paired as
//    common/model/stage_handoff.h says (receiver j gets the hidden state from
//    sender j % tp_s). Named "pipe.stage<s>-<s+1>.tp<i>" when i == j (always
//    so with equal tp), else "pipe.stage<s>-<s+1>.tp<i>-<j>". In it the
//    earlier stage is rank 0 (kPipeEarlierRank) and the later stage rank 1
//    (kPipeLaterRank). After a stage's row-parallel all-reduce every tp rank
//    holds the same (replicated) hidden state, so each sender forwards its
//    own copy: links run in parallel, nothing is gathered or scattered.
//    Every rank of stage s > 0 has exactly one prev_stage() link; a rank of
//    stage s < pp-1 has next_stage_links() to each receiver it feeds: one
//    with equal tp, several when the next stage has more tp ranks, none when
//    it has fewer (senders tp_{s+1} .. tp_s - 1 send nothing).
//  - Return links (pp > 1): the last stage hands sampled tokens back to
//    stage 0 with the same pairing (stage-0 rank j hears from last-stage rank
//    j % tp_last), groups "return.stage<L>-0.tp<i>" or "...tp<i>-<j>", with
//    stage 0 as rank 0 (kReturnFirstRank) and the last stage as rank 1
//    (kReturnLastRank).
//
// Create builds the tp group first, then the link from the previous stage,
// then the links to the next one (receivers ascending), then the return
// links; since stage 0 has no previous link and every rank waits on at most
// one link from an earlier stage, the rendezvous proceeds stage by stage and
// cannot deadlock.
//
// Thread-safety: as Communicator; the accessors are const and thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/store.h"
#include "worker/comm/communicator.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace tessera {

struct ProcessGroupOptions {
  int tp = 1;  // tensor-parallel ranks per stage (when tp_per_stage is empty)
  int pp = 1;  // pipeline stages
  // Empty: every stage has `tp` ranks. Otherwise pp entries, the tp of each
  // stage (`tp` is then ignored), as ParallelConfig::TpPerStage gives them.
  std::vector<int> tp_per_stage;
  int world_rank = 0;                     // this process, 0 <= world_rank < world size
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
  // Errors: kInvalidArgument (a tp or pp < 1, tp_per_stage without pp
  // entries, world_rank out of range), and the
  // errors of GlooCommunicator::Create (kDeadlineExceeded naming the group
  // and the missing rank's store key, kUnavailable).
  static StatusOr<std::unique_ptr<ProcessGroup>> Create(Store& store,
                                                        const ProcessGroupOptions& options);

  ~ProcessGroup();

  // Tensor-parallel ranks of this rank's stage.
  int tp_size() const { return tp_per_stage_[static_cast<size_t>(stage_)]; }
  int pp_size() const { return options_.pp; }
  // The tp of every stage (pp entries).
  const std::vector<int>& tp_per_stage() const { return tp_per_stage_; }
  // Sum of the stages' tp.
  int world_size() const;
  int world_rank() const { return options_.world_rank; }
  int stage() const { return stage_; }
  int tp_rank() const { return tp_rank_; }
  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return stage_ == options_.pp - 1; }

  // The tp group of this stage; never null.
  Communicator* tp() const { return tp_.get(); }
  // The pipe link from stage - 1 (this rank is kPipeLaterRank in it); null on
  // stage 0.
  Communicator* prev_stage() const { return prev_.get(); }
  // The pipe links to the receivers in stage + 1 this rank feeds, receivers
  // ascending (this rank is kPipeEarlierRank in each): one with equal tp,
  // none on the last stage or when stage + 1 has fewer tp ranks than this
  // rank's tp_rank + 1, several when it has more.
  std::vector<Communicator*> next_stage_links() const;
  // The tp ranks of stage + 1 that next_stage_links() reach, same order.
  const std::vector<int>& next_stage_receivers() const { return next_receivers_; }
  // Return links for sampled tokens (pp > 1): on stage 0 the one link from
  // its last-stage sender (this rank is kReturnFirstRank); on the last stage
  // the links to the stage-0 ranks it feeds (kReturnLastRank; possibly
  // none); empty on middle stages and when pp == 1.
  std::vector<Communicator*> return_links() const;

  // Sends `bytes` bytes (e.g. the hidden state, float32[tokens, hidden]) to
  // every receiver of next_stage_links(), in order (nothing when there are
  // none). Errors: kFailedPrecondition on the last stage; otherwise as
  // Communicator::Send.
  Status SendToNextStage(const void* data, size_t bytes);
  // Receives `bytes` bytes from this rank's sender in stage - 1.
  // Errors: kFailedPrecondition on stage 0; otherwise as Communicator::Recv.
  Status RecvFromPrevStage(void* data, size_t bytes);

 private:
  ProcessGroup(const ProcessGroupOptions& options, std::vector<int> tp_per_stage);

  const ProcessGroupOptions options_;
  const std::vector<int> tp_per_stage_;  // pp entries
  const int stage_;
  const int tp_rank_;
  std::shared_ptr<gloo::transport::Device> device_;  // shared by the communicators below
  std::unique_ptr<Communicator> tp_;
  std::unique_ptr<Communicator> prev_;
  std::vector<std::unique_ptr<Communicator>> next_;
  std::vector<int> next_receivers_;
  std::vector<std::unique_ptr<Communicator>> ret_;
};

}  // namespace tessera
