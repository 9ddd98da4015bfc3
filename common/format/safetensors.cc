#include "common/format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace tessera {

namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, so that
// a corrupt length cannot make us allocate the whole file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string Errno() { return std::strerror(errno); }

// Reads a non-negative JSON integer that fits int64.
bool GetNonNegative(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

}  // namespace

int64_t TensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorInfo::ShapeString() const { return ShapeToString(shape); }

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) {
    if (errno == ENOENT) return NotFound(path + ": no such safetensors file");
    return IoError(path + ": cannot open: " + Errno());
  }
  struct stat st;
  if (::fstat(f->fd_, &st) != 0) return IoError(path + ": fstat failed: " + Errno());
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  f->file_size_ = static_cast<uint64_t>(st.st_size);
  if (f->file_size_ < 8) {
    return InvalidArgument(path + ": truncated safetensors file: " + std::to_string(f->file_size_) +
                           " bytes, shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, f->file_size_, PROT_READ, MAP_PRIVATE, f->fd_, 0);
  if (map == MAP_FAILED) return IoError(path + ": mmap failed: " + Errno());
  f->map_ = static_cast<const uint8_t*>(map);

  uint8_t len_bytes[8];
  TESSERA_RETURN_IF_ERROR(f->Pread(0, 8, len_bytes));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > f->file_size_ - 8) {
    return InvalidArgument(path + ": truncated safetensors file: header length " +
                           std::to_string(header_len) + " extends beyond the end of the file (" +
                           std::to_string(f->file_size_) + " bytes)");
  }
  if (header_len > kMaxHeaderBytes) {
    return InvalidArgument(path + ": header length " + std::to_string(header_len) +
                           " exceeds the 100 MiB limit");
  }
  std::string header(header_len, '\0');
  TESSERA_RETURN_IF_ERROR(f->Pread(8, header_len, header.data()));
  f->data_start_ = 8 + header_len;
  TESSERA_RETURN_IF_ERROR(f->ParseHeader(header));
  return f;
}

Status SafetensorsFile::ParseHeader(const std::string& header) {
  json root;
  try {
    root = json::parse(header);
  } catch (const json::exception& e) {
    return InvalidArgument(path_ + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!root.is_object()) {
    return InvalidArgument(path_ + ": safetensors header is not a JSON object");
  }
  const uint64_t buffer_size = file_size_ - data_start_;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return InvalidArgument(path_ + ": '__metadata__' is not a JSON object");
      }
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          return InvalidArgument(path_ + ": '__metadata__' key '" + k + "' is not a string");
        }
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path_ + ": tensor '" + name + "': ";
    if (!entry.is_object()) return InvalidArgument(where + "entry is not a JSON object");
    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return InvalidArgument(where + "missing or non-string 'dtype'");
    }
    StatusOr<DType> dtype = ParseDType(dtype_it->get<std::string>());
    if (!dtype.ok()) return dtype.status().WithContext(path_ + ": tensor '" + name + "'");

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return InvalidArgument(where + "missing or non-array 'shape'");
    }
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.file = path_;
    // Element count with overflow checks; the byte size must match the span.
    uint64_t nbytes = DTypeSize(info.dtype);
    bool overflow = false;
    for (const json& d : *shape_it) {
      int64_t v;
      if (!GetNonNegative(d, &v)) {
        return InvalidArgument(where + "'shape' holds " + d.dump() +
                               ", not a non-negative integer");
      }
      info.shape.push_back(v);
      overflow = overflow || __builtin_mul_overflow(nbytes, static_cast<uint64_t>(v), &nbytes);
    }

    auto off_it = entry.find("data_offsets");
    int64_t begin = 0, end = 0;
    if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
        !GetNonNegative((*off_it)[0], &begin) || !GetNonNegative((*off_it)[1], &end)) {
      return InvalidArgument(where + "'data_offsets' must be [begin, end] non-negative integers");
    }
    if (begin > end) {
      return InvalidArgument(where + "data_offsets [" + std::to_string(begin) + ", " +
                             std::to_string(end) + "] have begin > end");
    }
    if (static_cast<uint64_t>(end) > buffer_size) {
      return InvalidArgument(where + "data_offsets [" + std::to_string(begin) + ", " +
                             std::to_string(end) +
                             "] lie beyond the end of the file (data buffer is " +
                             std::to_string(buffer_size) + " bytes; truncated file?)");
    }
    const uint64_t span = static_cast<uint64_t>(end - begin);
    if (overflow || nbytes != span) {
      return InvalidArgument(where + "shape " + info.ShapeString() + " of " +
                             DTypeName(info.dtype) + " needs " +
                             (overflow ? std::string("more than 2^64") : std::to_string(nbytes)) +
                             " bytes but data_offsets span " + std::to_string(span));
    }
    info.data_begin = data_start_ + static_cast<uint64_t>(begin);
    info.nbytes = span;
    tensors_.push_back(std::move(info));
  }

  // No two non-empty tensors may share a byte.
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors_) {
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    const TensorInfo* cur = by_offset[i];
    if (cur->data_begin < prev->data_begin + prev->nbytes) {
      auto range = [this](const TensorInfo* t) {
        return "[" + std::to_string(t->data_begin - data_start_) + ", " +
               std::to_string(t->data_begin - data_start_ + t->nbytes) + ")";
      };
      return InvalidArgument(path_ + ": data of tensors '" + prev->name + "' " + range(prev) +
                             " and '" + cur->name + "' " + range(cur) + " overlap");
    }
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return Status::Ok();
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), file_size_);
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

const uint8_t* SafetensorsFile::MappedData(const TensorInfo& info) const {
  TESSERA_CHECK(info.file == path_ && info.data_begin + info.nbytes <= file_size_);
  return map_ + info.data_begin;
}

Status SafetensorsFile::Pread(uint64_t offset, uint64_t n, void* dst) const {
  if (offset > file_size_ || n > file_size_ - offset) {
    return OutOfRange(path_ + ": read of " + std::to_string(n) + " bytes at offset " +
                      std::to_string(offset) + " exceeds the file (" + std::to_string(file_size_) +
                      " bytes)");
  }
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError(path_ + ": pread of " + std::to_string(n) + " bytes at offset " +
                     std::to_string(offset) + " failed: " + Errno());
    }
    if (r == 0) {
      return IoError(path_ + ": unexpected end of file at offset " + std::to_string(offset + done) +
                     " (file changed on disk?)");
    }
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status SafetensorsFile::ReadBytes(uint64_t offset, uint64_t n, void* dst) const {
  TESSERA_RETURN_IF_ERROR(Pread(offset, n, dst));
  bytes_read_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace tessera
