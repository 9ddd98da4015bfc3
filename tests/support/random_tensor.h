// Host F32 tensors of N(0, stddev^2) values, the same for the same seed: the inputs of the CPU
// kernel tests (the GPU tests round theirs to a dtype: tests/gpu/gpu_test_util.h Random).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "common/base/tensor.h"

namespace tessera::testing {

inline Tensor RandomNormal(std::vector<int64_t> shape, uint64_t seed, float stddev = 1.0f) {
  Tensor t = Tensor::Empty(std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

}  // namespace tessera::testing
