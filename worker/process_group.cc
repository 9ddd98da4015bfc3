#include "worker/process_group.h"

#include <fmt/format.h>

#include "common/parallel_rank.h"
#include "worker/gloo_communicator.h"

namespace tessera {

ProcessGroup::ProcessGroup(const ProcessGroupOptions& options)
    : options_(options),
      stage_(StageOf(options.world_rank, options.tp)),
      tp_rank_(TpRankOf(options.world_rank, options.tp)) {}

ProcessGroup::~ProcessGroup() = default;

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(Store& store,
                                                             const ProcessGroupOptions& options) {
  if (options.tp < 1 || options.pp < 1) {
    return InvalidArgument(
        fmt::format("process group: tp ({}) and pp ({}) must be >= 1", options.tp, options.pp));
  }
  if (options.world_rank < 0 || options.world_rank >= options.tp * options.pp) {
    return InvalidArgument(
        fmt::format("process group: world rank {} is outside [0, {}) for "
                    "tp={} pp={}",
                    options.world_rank, options.tp * options.pp, options.tp, options.pp));
  }
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(options));
  const int tp = options.tp;
  const int stage = pg->stage_;
  const int tp_rank = pg->tp_rank_;
  if (tp > 1 || options.pp > 1) {
    TESSERA_ASSIGN_OR_RETURN(pg->device_,
                             GlooCommunicator::CreateTcpDevice(options.hostname, options.iface));
  }
  const std::string prefix = options.key_prefix.empty() ? "" : options.key_prefix + "/";

  GlooCommunicatorOptions base;
  base.timeout_seconds = options.timeout_seconds;
  base.connect_timeout_seconds = options.connect_timeout_seconds;
  base.hostname = options.hostname;
  base.iface = options.iface;

  GlooCommunicatorOptions tp_opts = base;
  tp_opts.group = fmt::format("{}tp.stage{}", prefix, stage);
  tp_opts.rank = tp_rank;
  tp_opts.size = tp;
  for (int t = 0; t < tp; ++t) tp_opts.world_ranks.push_back(WorldRank(stage, t, tp));
  TESSERA_ASSIGN_OR_RETURN(pg->tp_, GlooCommunicator::Create(store, tp_opts, pg->device_));

  // The pipe group between stage s and s+1 for this tp rank.
  auto pipe_options = [&](int s, int rank_in_pipe) {
    GlooCommunicatorOptions o = base;
    o.group = fmt::format("{}pipe.stage{}-{}.tp{}", prefix, s, s + 1, tp_rank);
    o.rank = rank_in_pipe;
    o.size = 2;
    o.world_ranks = {WorldRank(s, tp_rank, tp), WorldRank(s + 1, tp_rank, tp)};
    return o;
  };
  if (stage > 0) {
    TESSERA_ASSIGN_OR_RETURN(
        pg->prev_,
        GlooCommunicator::Create(store, pipe_options(stage - 1, kPipeLaterRank), pg->device_));
  }
  if (stage < options.pp - 1) {
    TESSERA_ASSIGN_OR_RETURN(
        pg->next_,
        GlooCommunicator::Create(store, pipe_options(stage, kPipeEarlierRank), pg->device_));
  }
  // The return link: the last stage hands sampled tokens back to stage 0.
  // Built after the pipes, so the rendezvous still proceeds stage by stage.
  if (options.pp > 1 && (stage == 0 || stage == options.pp - 1)) {
    GlooCommunicatorOptions o = base;
    o.group = fmt::format("{}return.stage{}-0.tp{}", prefix, options.pp - 1, tp_rank);
    o.rank = stage == 0 ? kReturnFirstRank : kReturnLastRank;
    o.size = 2;
    o.world_ranks = {WorldRank(0, tp_rank, tp), WorldRank(options.pp - 1, tp_rank, tp)};
    TESSERA_ASSIGN_OR_RETURN(pg->ret_, GlooCommunicator::Create(store, o, pg->device_));
  }
  return pg;
}

Status ProcessGroup::SendToNextStage(const void* data, size_t bytes) {
  if (!next_) {
    return FailedPrecondition(
        fmt::format("send to next stage on world rank {}: stage {} is the "
                    "last of {} stages",
                    options_.world_rank, stage_, options_.pp));
  }
  return next_->Send(data, bytes, kPipeLaterRank);
}

Status ProcessGroup::RecvFromPrevStage(void* data, size_t bytes) {
  if (!prev_) {
    return FailedPrecondition(
        fmt::format("recv from previous stage on world rank {}: stage 0 has "
                    "no previous stage",
                    options_.world_rank));
  }
  return prev_->Recv(data, bytes, kPipeEarlierRank);
}

}  // namespace tessera
