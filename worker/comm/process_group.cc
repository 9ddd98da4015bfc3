#include "worker/comm/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

#include "common/model/parallel_rank.h"
#include "common/model/stage_handoff.h"
#include "worker/comm/gloo_communicator.h"

namespace tessera {

namespace {

// "pipe.stage0-1.tp1" for the same tp rank on both ends, else
// "pipe.stage0-1.tp1-3" (sender tp rank 1 to receiver tp rank 3).
std::string LinkName(const std::string& prefix, const std::string& kind, int from_stage,
                     int to_stage, int sender, int receiver) {
  if (sender == receiver)
    return fmt::format("{}{}.stage{}-{}.tp{}", prefix, kind, from_stage, to_stage, sender);
  return fmt::format("{}{}.stage{}-{}.tp{}-{}", prefix, kind, from_stage, to_stage, sender,
                     receiver);
}

}  // namespace

ProcessGroup::ProcessGroup(const ProcessGroupOptions& options, std::vector<int> tp_per_stage)
    : options_(options),
      tp_per_stage_(std::move(tp_per_stage)),
      stage_(StageOf(options.world_rank, tp_per_stage_)),
      tp_rank_(TpRankOf(options.world_rank, tp_per_stage_)) {}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::world_size() const {
  return std::accumulate(tp_per_stage_.begin(), tp_per_stage_.end(), 0);
}

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(Store& store,
                                                             const ProcessGroupOptions& options) {
  const int pp = options.pp;
  if (pp < 1) return InvalidArgument(fmt::format("process group: pp ({}) must be >= 1", pp));
  std::vector<int> tps = options.tp_per_stage;
  if (tps.empty()) {
    if (options.tp < 1) {
      return InvalidArgument(
          fmt::format("process group: tp ({}) and pp ({}) must be >= 1", options.tp, pp));
    }
    tps.assign(static_cast<size_t>(pp), options.tp);
  } else if (static_cast<int>(tps.size()) != pp) {
    return InvalidArgument(fmt::format("process group: tp_per_stage=[{}] has {} entries but pp={}",
                                       fmt::join(tps, ", "), tps.size(), pp));
  }
  for (int s = 0; s < pp; ++s) {
    if (tps[static_cast<size_t>(s)] < 1) {
      return InvalidArgument(fmt::format("process group: stage {} has tp={}, must be >= 1", s,
                                         tps[static_cast<size_t>(s)]));
    }
  }
  const int world = std::accumulate(tps.begin(), tps.end(), 0);
  if (options.world_rank < 0 || options.world_rank >= world) {
    return InvalidArgument(
        fmt::format("process group: world rank {} is outside [0, {}) for tp={} pp={}",
                    options.world_rank, world,
                    options.tp_per_stage.empty() ? std::to_string(options.tp)
                                                 : fmt::format("[{}]", fmt::join(tps, ", ")),
                    pp));
  }
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup(options, tps));
  const int stage = pg->stage_;
  const int tp_rank = pg->tp_rank_;
  const int tp = tps[static_cast<size_t>(stage)];
  if (world > 1) {
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
  for (int t = 0; t < tp; ++t) tp_opts.world_ranks.push_back(WorldRank(stage, t, tps));
  TESSERA_ASSIGN_OR_RETURN(pg->tp_, GlooCommunicator::Create(store, tp_opts, pg->device_));

  // The 2-rank pipe between tp rank `sender` of stage `from` and tp rank
  // `receiver` of stage `to` = from + 1; the sender is rank 0 in it, and this
  // rank joins as `rank_in_link`.
  auto link = [&](const std::string& kind, int from, int sender, int to, int receiver,
                  int rank_in_link) {
    GlooCommunicatorOptions o = base;
    o.group = LinkName(prefix, kind, from, to, sender, receiver);
    o.rank = rank_in_link;
    o.size = 2;
    o.world_ranks = {WorldRank(from, sender, tps), WorldRank(to, receiver, tps)};
    return GlooCommunicator::Create(store, o, pg->device_);
  };
  // The pipe from this rank's sender in stage - 1.
  if (stage > 0) {
    const int sender = HandoffSender(tp_rank, tps[static_cast<size_t>(stage - 1)], tp);
    TESSERA_ASSIGN_OR_RETURN(pg->prev_,
                             link("pipe", stage - 1, sender, stage, tp_rank, kPipeLaterRank));
  }
  // The pipes to the receivers this rank feeds in stage + 1.
  if (stage < pp - 1) {
    pg->next_receivers_ = HandoffReceivers(tp_rank, tp, tps[static_cast<size_t>(stage + 1)]);
    for (int receiver : pg->next_receivers_) {
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c,
                               link("pipe", stage, tp_rank, stage + 1, receiver, kPipeEarlierRank));
      pg->next_.push_back(std::move(c));
    }
  }
  // The return links: the last stage hands sampled tokens back to stage 0.
  // Built after the pipes, so the rendezvous still proceeds stage by stage.
  // In these groups stage 0 is rank 0, so world_ranks lists it first.
  if (pp > 1 && (stage == 0 || stage == pp - 1)) {
    const int last = pp - 1;
    const int tp_last = tps[static_cast<size_t>(last)];
    auto ret = [&](int last_sender, int first_receiver, int rank_in_link) {
      GlooCommunicatorOptions o = base;
      o.group = LinkName(prefix, "return", last, 0, last_sender, first_receiver);
      o.rank = rank_in_link;
      o.size = 2;
      o.world_ranks = {WorldRank(0, first_receiver, tps), WorldRank(last, last_sender, tps)};
      return GlooCommunicator::Create(store, o, pg->device_);
    };
    if (stage == 0) {
      const int sender = HandoffSender(tp_rank, tp_last, tp);
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c,
                               ret(sender, tp_rank, kReturnFirstRank));
      pg->ret_.push_back(std::move(c));
    } else {
      for (int receiver : HandoffReceivers(tp_rank, tp, tps[0])) {
        TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c,
                                 ret(tp_rank, receiver, kReturnLastRank));
        pg->ret_.push_back(std::move(c));
      }
    }
  }
  return pg;
}

std::vector<Communicator*> ProcessGroup::next_stage_links() const {
  std::vector<Communicator*> out;
  for (const auto& c : next_) out.push_back(c.get());
  return out;
}

std::vector<Communicator*> ProcessGroup::return_links() const {
  std::vector<Communicator*> out;
  for (const auto& c : ret_) out.push_back(c.get());
  return out;
}

Status ProcessGroup::SendToNextStage(const void* data, size_t bytes) {
  if (stage_ == options_.pp - 1) {
    return FailedPrecondition(
        fmt::format("send to next stage on world rank {}: stage {} is the "
                    "last of {} stages",
                    options_.world_rank, stage_, options_.pp));
  }
  for (const auto& c : next_) TESSERA_RETURN_IF_ERROR(c->Send(data, bytes, kPipeLaterRank));
  return Status::Ok();
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
