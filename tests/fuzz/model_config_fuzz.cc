// libFuzzer harness: config.json parsing (ParseModelConfig), then the
// parallel layouts a coordinator would derive from an accepted config.
#include <cstdint>
#include <string>

#include "common/format/model_config.h"
#include "common/model/parallel_config.h"
#include "common/model/shard_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ParseModelConfig(text, "fuzz/config.json");
  if (!config.ok()) return 0;
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) {
      auto layout = ParallelConfig::Make(*config, tp, pp, {});
      if (!layout.ok()) continue;
      for (int rank = 0; rank < layout->world_size(); ++rank) {
        auto spec = ShardSpec::Make(*config, *layout, rank);
        if (spec.ok()) (void)spec->WeightBytes(DType::kF32);
      }
    }
  }
  return 0;
}
