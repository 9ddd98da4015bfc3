// Helpers of the GPU tests (tests/gpu/*_test.cc, one program:
// tessera_gpu_test): the command-line settings, a CUDA backend per dtype,
// random inputs rounded to a dtype, upload/download, and the tolerance check
// documented below.
//
// Tolerances. Inputs are drawn in fp32 and rounded to the dtype under test;
// the CPU reference computes in fp32 on exactly those rounded values, so the
// GPU's only extra errors are the rounding of its outputs (and of
// intermediates it stores in the dtype) and fp32 summation order:
//   F32:  |gpu - cpu| <= 1e-4 * scale + 1e-4 * |cpu|
//   BF16: |gpu - cpu| <= 1e-2 * scale + 1.6e-2 * |cpu|  (8 mantissa bits: 2^-8 = 3.9e-3 per
//   rounding) F16:  |gpu - cpu| <= 2e-3 * scale + 2e-3 * |cpu|    (11 bits: 2^-11 = 4.9e-4 per
//   rounding)
// where scale is the largest |cpu| of the output. Copies (embedding, KV
// writes, gathers) must be bit-exact; sampling must pick the CPU's token.
//
// Usage: tessera_gpu_test [--fixtures DIR] [--hf-dir DIR --hf-ref JSON] [gtest flags]
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/engine/engine.h"
#include "common/format/model_config.h"
#include "common/net/file_store.h"
#include "common/net/http_client.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/cuda_runtime.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/linear_fp8.h"
#include "kernels/paged_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/swiglu.h"
#include "kernels/tensor_ops.h"
#include "support/model_harness.h"
#include "support/test_util.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/exec/pipeline_executor.h"
#include "worker/model/rope_frequencies.h"

namespace tessera {

namespace fs = std::filesystem;
using nlohmann::json;
using ::tessera::testing::RelMaxDiff;

// Set by main (gpu_main.cc) from the command line and the device count.
extern std::string g_fixtures;          // --fixtures DIR (default "tests/fixtures")
extern std::string g_hf_dir, g_hf_ref;  // --hf-dir, --hf-ref
extern int g_devices;                   // CUDA devices

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One CUDA backend per compute dtype on device 0.
inline kernels::Backend& Gpu(DType dtype) {
  static std::map<DType, std::unique_ptr<kernels::Backend>> backends;
  auto it = backends.find(dtype);
  if (it == backends.end()) {
    auto b = kernels::CreateCudaBackend(0, dtype);
    if (!b.ok()) {
      std::fprintf(stderr, "CreateCudaBackend: %s\n", b.status().ToString().c_str());
      std::abort();
    }
    it = backends.emplace(dtype, std::move(*b)).first;
  }
  TESSERA_CHECK(kernels::MakeCurrent(*it->second).ok());
  return *it->second;
}

struct Tol {
  double atol, rtol;
};
inline Tol TolFor(DType d) {
  if (d == DType::kBF16) return {1e-2, 1.6e-2};
  if (d == DType::kF16) return {2e-3, 2e-3};
  return {1e-4, 1e-4};
}

// A host tensor of `dtype` holding N(0, 1) * scale rounded to dtype, and its
// F32 copy (the same values exactly).
struct HostPair {
  Tensor f32, raw;
};
inline HostPair Random(std::vector<int64_t> shape, uint64_t seed, DType dtype, float scale = 1.0f) {
  HostPair p{Tensor::Empty(shape), Tensor::Empty(shape, dtype)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(p.f32.numel()));
  for (float& x : v) x = dist(rng) * scale;
  ConvertFromF32(dtype, v.data(), p.raw.raw(), v.size());
  ConvertToF32(dtype, p.raw.raw(), p.f32.data<float>(), v.size());
  return p;
}

inline Tensor Up(kernels::Backend& b, const Tensor& host) {
  auto t = b.Upload(host);
  TESSERA_CHECK(t.ok());
  return *t;
}

inline Tensor Dev(kernels::Backend& b, std::vector<int64_t> shape, DType dtype) {
  auto t = b.Zeros(shape, dtype);
  TESSERA_CHECK(t.ok());
  return *t;
}

inline std::vector<float> Down(kernels::Backend& b, const Tensor& dev) {
  auto h = b.ToHost(dev);
  TESSERA_CHECK(h.ok());
  std::vector<float> out(static_cast<size_t>(h->numel()));
  ConvertToF32(h->dtype(), h->raw(), out.data(), out.size());
  return out;
}

inline std::vector<float> Vec(const Tensor& host_f32) {
  return std::vector<float>(host_f32.data<float>(), host_f32.data<float>() + host_f32.numel());
}

// Expects got ~ want within the dtype's tolerance; prints the worst element.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, DType dtype,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const Tol tol = TolFor(dtype);
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::abs(w)));
  size_t bad = 0, worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double bound = tol.atol * scale + tol.rtol * std::abs(want[i]);
    if (!(err <= bound)) ++bad;
    if (!(err <= worst_err)) {
      worst_err = err;
      worst = i;
    }
  }
  std::printf("  %-48s %-4s max |err| %.3g (scale %.3g) at %zu\n", what.c_str(), DTypeName(dtype),
              worst_err, scale, worst);
  EXPECT_EQ(bad, 0u) << what << " " << DTypeName(dtype) << ": " << bad << " of " << got.size()
                     << " outside tolerance; worst index " << worst << " got " << got[worst]
                     << " want " << want[worst];
}

// The fixture models under g_fixtures/models that have a reference.json,
// sorted: the dense families and the mixtures of experts (whose MoE layer runs
// the CUDA router and grouped expert kernels, kernels/moe_experts.h).
inline std::vector<std::string> FixtureNames() {
  std::vector<std::string> names;
  const fs::path root = fs::path(g_fixtures) / "models";
  if (fs::exists(root))
    for (const auto& e : fs::directory_iterator(root)) {
      if (!fs::exists(e.path() / "reference.json")) continue;
      names.push_back(e.path().filename().string());
    }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tessera
