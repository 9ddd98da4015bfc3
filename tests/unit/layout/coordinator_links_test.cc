// tessera-coordinator links common/ only (docs/architecture.md, "The
// dependency rule"): no kernels, CUDA, NCCL, Gloo, hwloc or OpenBLAS, neither
// as shared libraries (ldd) nor as static code (nm: no symbol of the kernels'
// or Gloo's namespaces, nor of the worker's executors). The worker binary is
// checked the other way, so the scan itself is known to see such symbols.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/test_util.h"

namespace tessera {
namespace {

using ::tessera::testing::BinaryDir;
using ::tessera::testing::RunCommand;

const std::vector<std::string> kForbiddenLibraries = {"libcuda",     "libcudart", "libcublas",
                                                      "libnccl",     "libgloo",   "libhwloc",
                                                      "libopenblas", "libblas",   "libnvidia-ml"};
// Demangled prefixes of code the coordinator must not contain.
const std::vector<std::string> kForbiddenSymbols = {
    "tessera::kernels::", "gloo::", "tessera::LlamaModel::", "tessera::KvCache::",
    "tessera::GlooCommunicator::"};

std::string Shared(const std::string& binary) {
  auto r = RunCommand("ldd '" + binary + "'");
  EXPECT_EQ(r.rc, 0) << r.output;
  return r.output;
}

// Defined symbols (not references), demangled.
std::string Defined(const std::string& binary) {
  auto r = RunCommand("nm -C --defined-only '" + binary + "'");
  EXPECT_EQ(r.rc, 0) << r.output.substr(0, 2000);
  return r.output;
}

TEST(CoordinatorLinks, NoKernelsCudaNcclGlooHwlocOrBlas) {
  const std::string coordinator = BinaryDir() + "/tessera-coordinator";
  const std::string shared = Shared(coordinator);
  for (const auto& lib : kForbiddenLibraries) {
    EXPECT_EQ(shared.find(lib), std::string::npos) << coordinator << " loads " << lib << ":\n"
                                                   << shared;
  }
  const std::string symbols = Defined(coordinator);
  ASSERT_NE(symbols.find("tessera::CoordinatorDaemon"), std::string::npos)
      << "nm shows no coordinator symbols: is the binary stripped?";
  for (const auto& sym : kForbiddenSymbols) {
    const size_t at = symbols.find(sym);
    EXPECT_EQ(at, std::string::npos)
        << coordinator << " contains " << sym << ": "
        << (at == std::string::npos ? "" : symbols.substr(symbols.rfind('\n', at) + 1, 200));
  }
}

// The same scan sees kernels and Gloo in the worker, which links them.
TEST(CoordinatorLinks, TheScanSeesTheWorkersKernelsAndGloo) {
  const std::string worker = BinaryDir() + "/tessera-worker";
  const std::string symbols = Defined(worker);
  EXPECT_NE(symbols.find("tessera::kernels::"), std::string::npos);
  EXPECT_NE(symbols.find("gloo::"), std::string::npos);
  EXPECT_NE(Shared(worker).find("libopenblas"), std::string::npos);
}

}  // namespace
}  // namespace tessera
