// libFuzzer harness: the safetensors header parser (SafetensorsFile::Open on
// a file holding the input), then reads of what it accepted.
#include <cstdint>
#include <vector>

#include "common/format/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string path = fuzz::ScratchDir() + "/input.safetensors";
  fuzz::WriteFile(path, std::string_view(reinterpret_cast<const char*>(data), size));
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  const SafetensorsFile& f = **file;
  for (const TensorInfo& t : f.tensors()) {
    // Accepted tensors lie inside the file, after the header.
    if (t.data_begin < f.data_start() || t.data_begin > f.file_size() ||
        t.nbytes > f.file_size() - t.data_begin)
      fuzz::Fail("tensor '" + t.name + "' lies outside the file");
    if (f.Find(t.name) != &t) fuzz::Fail("Find('" + t.name + "') does not find it");
    std::vector<uint8_t> bytes(static_cast<size_t>(t.nbytes));
    if (!f.ReadBytes(t.data_begin, t.nbytes, bytes.data()).ok())
      fuzz::Fail("ReadBytes failed for accepted tensor '" + t.name + "'");
    (void)t.ShapeString();
  }
  return 0;
}
