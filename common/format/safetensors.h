// SafetensorsFile: one read-only `.safetensors` file, memory-mapped, with its
// header parsed and validated.
//
// Format (safetensors spec, huggingface/safetensors README):
//   bytes [0, 8)          N: little-endian uint64, the header length in bytes
//   bytes [8, 8+N)        a UTF-8 JSON object; each key other than
//                         "__metadata__" is a tensor name mapping to
//                         {"dtype": "F32", "shape": [d0, ...],
//                          "data_offsets": [begin, end]}; "__metadata__",
//                         when present, maps strings to strings
//   bytes [8+N, EOF)      the byte buffer; data_offsets are relative to it
//
// Open() rejects any file a reader could be misled by: a truncated file, a
// header length beyond the file, a header that is not a JSON object of the
// types above, data offsets beyond the file or overlapping another tensor's,
// a dtype Tessera does not know, and a shape whose byte size differs from
// end - begin. Every error names the file and, where there is one, the tensor.
//
// Thread-safety: immutable after Open(); all const methods, ReadBytes
// included (it uses pread), may be called concurrently from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/status.h"

namespace tessera {

// Where one tensor's bytes lie in a safetensors file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major; empty for a scalar
  uint64_t data_begin = 0;     // absolute byte offset in `file` (header included)
  uint64_t nbytes = 0;         // = NumElements() * DTypeSize(dtype)
  std::string file;            // path of the safetensors file holding the bytes

  int64_t NumElements() const;
  // "[4096, 11008]".
  std::string ShapeString() const;
};

// "[4096, 11008]" for any shape.
std::string ShapeToString(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Opens, maps and validates `path`. Errors: kNotFound when the file does not
  // exist, kIoError when it cannot be opened or mapped, kInvalidArgument for a
  // malformed file (the message names `path` and the offending tensor),
  // kUnimplemented for an unknown dtype (naming `path` and the tensor).
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // All tensors, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const TensorInfo* Find(std::string_view name) const;
  // Size of the whole file in bytes.
  uint64_t file_size() const { return file_size_; }
  // Offset of the byte buffer (8 + header length).
  uint64_t data_start() const { return data_start_; }
  // The "__metadata__" entries (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Zero-copy pointer to the tensor's `info.nbytes` bytes inside the mapping.
  // Touching it faults file pages into the process (they count towards RSS);
  // prefer ReadBytes for bounded-memory loading. Precondition: `info` came
  // from this file.
  const uint8_t* MappedData(const TensorInfo& info) const;

  // Copies bytes [offset, offset + n) of the file into `dst` with pread.
  // Errors: kOutOfRange (naming the file) when the range exceeds the file,
  // kIoError when the read fails.
  Status ReadBytes(uint64_t offset, uint64_t n, void* dst) const;

  // Total bytes copied by ReadBytes (header reads in Open excluded).
  int64_t BytesRead() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  SafetensorsFile() = default;
  Status ParseHeader(const std::string& header);
  // pread loop without accounting in bytes_read_.
  Status Pread(uint64_t offset, uint64_t n, void* dst) const;

  std::string path_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  mutable std::atomic<int64_t> bytes_read_{0};
};

}  // namespace tessera
