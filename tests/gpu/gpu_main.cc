// GPU tests: every CUDA kernel against the CPU kernels on random inputs, the
// fixture models on the CUDA backend against the transformers references,
// NCCL collectives and tp=2 on two GPUs, and (given --hf-dir/--hf-ref) a
// model against transformers computing in bf16 on the same GPU.
//
// Not part of ctest (CI has no GPU); scripts/gpu-run runs it on the device.
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
//
// This file: the command line and main; the tests are in tests/gpu/gpu_*_test.cc.
#include <cstdio>
#include <string>

#include "gpu/gpu_test_util.h"

namespace tessera {

std::string g_fixtures = "tests/fixtures";
std::string g_hf_dir, g_hf_ref;
int g_devices = 0;

}  // namespace tessera

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep the log up to a crash
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--fixtures")
      tessera::g_fixtures = next();
    else if (a == "--hf-dir")
      tessera::g_hf_dir = next();
    else if (a == "--hf-ref")
      tessera::g_hf_ref = next();
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto count = tessera::kernels::CudaDeviceCount();
  if (!count.ok() || *count == 0) {
    std::fprintf(stderr, "no CUDA device: %s\n",
                 count.ok() ? "0 devices" : count.status().ToString().c_str());
    return 1;
  }
  tessera::g_devices = *count;
  std::printf("CUDA devices: %d\n", tessera::g_devices);
  return RUN_ALL_TESTS();
}
