// MakeScaledModel: a copy of a fixture model directory with one F32 tensor
// multiplied by a factor, written on the fly by the tests that need a model
// whose activations overflow (down_proj x 1e38: every logit NaN or inf).
//
// Thread-safety: a free function; concurrent calls must use distinct `dst`.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/format/safetensors.h"
#include "common/format/safetensors_writer.h"

namespace tessera::testing {

// Copies every file of `src` (a single-file safetensors model) to `dst`
// (created), except reference.json, and rewrites model.safetensors with each
// element of the F32 tensor `tensor` multiplied by `factor`.
// Errors: kNotFound naming `tensor` when it is not an F32 tensor of the file;
// those of SafetensorsFile::Open and WriteSafetensors.
inline Status MakeScaledModel(const std::string& src, const std::string& dst,
                              const std::string& tensor, float factor) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dst, ec);
  if (ec) return IoError("cannot create " + dst + ": " + ec.message());
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (name == "model.safetensors" || name == "reference.json") continue;
    fs::copy_file(e.path(), fs::path(dst) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return IoError("cannot copy " + e.path().string() + ": " + ec.message());
  }
  TESSERA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(src + "/model.safetensors"));
  std::vector<SafetensorsEntry> out;
  bool found = false;
  for (const TensorInfo& info : file->tensors()) {
    const uint8_t* p = file->MappedData(info);
    SafetensorsEntry e{info.name, info.dtype, info.shape, std::vector<uint8_t>(p, p + info.nbytes)};
    if (info.name == tensor && info.dtype == DType::kF32) {
      found = true;
      auto* v = reinterpret_cast<float*>(e.bytes.data());
      for (int64_t i = 0; i < info.NumElements(); ++i) v[i] *= factor;
    }
    out.push_back(std::move(e));
  }
  if (!found) return NotFound("no F32 tensor " + tensor + " in " + src);
  return WriteSafetensors(dst + "/model.safetensors", out, file->metadata());
}

}  // namespace tessera::testing
