#include "common/format/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace tessera {

std::vector<uint8_t> EncodeFloats(DType dtype, const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&out[4 * i], &values[i], 4);
        break;
      case DType::kF16: {
        const uint16_t h = F32ToF16(values[i]);
        std::memcpy(&out[2 * i], &h, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t b = F32ToBF16(values[i]);
        std::memcpy(&out[2 * i], &b, 2);
        break;
      }
      default:
        TESSERA_CHECK(false && "EncodeFloats: not a float dtype");
    }
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return InvalidArgument(path + ": tensor name '" + t.name + "' is reserved or repeated");
    }
    uint64_t expected = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0)
        return InvalidArgument(path + ": tensor '" + t.name + "' has a negative dimension");
      expected *= static_cast<uint64_t>(d);
    }
    if (expected != t.bytes.size()) {
      return InvalidArgument(path + ": tensor '" + t.name + "': shape and dtype " +
                             DTypeName(t.dtype) + " need " + std::to_string(expected) +
                             " bytes, got " + std::to_string(t.bytes.size()));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + expected}}};
    offset += expected;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return IoError(path + ": cannot create: " + std::strerror(errno));
  bool ok =
      std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const SafetensorsEntry& t : tensors) {
    if (!ok) break;
    ok = t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  const int saved_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return IoError(path + ": write failed: " + std::strerror(saved_errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    return IoError(path + ": rename from " + tmp + " failed: " + err);
  }
  return Status::Ok();
}

}  // namespace tessera
