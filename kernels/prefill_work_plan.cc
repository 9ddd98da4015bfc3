#include "kernels/prefill_work_plan.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include "common/base/status.h"

namespace tessera::kernels {

namespace {

struct Item {
  int64_t cost;
  int32_t seq, tile, head;
};

}  // namespace

PrefillWorkPlan PlanPrefillWork(std::span<const PrefillWorkSeq> seqs, int64_t heads, int64_t ctas,
                                int64_t tile_q) {
  TESSERA_CHECK(heads > 0 && ctas > 0 && tile_q > 0);
  std::vector<Item> items;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const PrefillWorkSeq& q = seqs[s];
    TESSERA_CHECK(q.q_len >= 0 && q.q_len <= q.kv_len);
    const int64_t tiles = (q.q_len + tile_q - 1) / tile_q;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t reads = std::min<int64_t>(q.kv_len, q.kv_len - q.q_len + (t + 1) * tile_q);
      for (int64_t h = 0; h < heads; ++h)
        items.push_back({reads + tile_q, static_cast<int32_t>(s), static_cast<int32_t>(t),
                         static_cast<int32_t>(h)});
    }
  }
  // Largest first; ties in (seq, tile, head) order, so the plan is a function of its input.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  // The least loaded CTA (lowest index on a tie) takes the next item.
  using Load = std::pair<int64_t, int64_t>;  // (cost so far, cta)
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> least;
  for (int64_t c = 0; c < ctas; ++c) least.push({0, c});
  std::vector<std::vector<int32_t>> per_cta(static_cast<size_t>(ctas));
  PrefillWorkPlan plan;
  for (size_t i = 0; i < items.size(); ++i) {
    auto [load, cta] = least.top();
    least.pop();
    per_cta[static_cast<size_t>(cta)].push_back(static_cast<int32_t>(i));
    least.push({load + items[i].cost, cta});
    plan.total_cost += items[i].cost;
  }
  while (!least.empty()) {
    plan.max_cta_cost = std::max(plan.max_cta_cost, least.top().first);
    least.pop();
  }
  plan.ctas = ctas;
  plan.works = static_cast<int64_t>(items.size());
  plan.values.assign(static_cast<size_t>(ctas + 1 + 7 * plan.works), 0);
  int32_t* v = plan.values.data();
  int64_t w = 0;
  for (int64_t c = 0; c < ctas; ++c) {
    for (int32_t i : per_cta[static_cast<size_t>(c)]) {
      const Item& it = items[static_cast<size_t>(i)];
      const PrefillWorkSeq& q = seqs[static_cast<size_t>(it.seq)];
      v[plan.Offset(PrefillWorkPlan::kQoTile) + w] = it.tile;
      v[plan.Offset(PrefillWorkPlan::kQoIndptr) + w] = q.q_begin;
      v[plan.Offset(PrefillWorkPlan::kKvIndptr) + w] = q.kv_begin;
      v[plan.Offset(PrefillWorkPlan::kQoLen) + w] = q.q_len;
      v[plan.Offset(PrefillWorkPlan::kKvLen) + w] = q.kv_len;
      v[plan.Offset(PrefillWorkPlan::kHead) + w] = it.head;
      v[plan.Offset(PrefillWorkPlan::kBatch) + w] = q.batch;
      ++w;
    }
    v[c + 1] = static_cast<int32_t>(w);
  }
  return plan;
}

}  // namespace tessera::kernels
