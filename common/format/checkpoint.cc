#include "common/format/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace tessera {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool IsFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

}  // namespace

Checkpoint::~Checkpoint() = default;

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& model_dir,
                                                       size_t staging_bytes) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = model_dir;
  ckpt->staging_bytes_ = std::max<size_t>(8, staging_bytes / 8 * 8);
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return NotFound(model_dir + ": model directory does not exist");
  }
  const fs::path dir(model_dir);
  if (IsFile(dir / kSingleFile)) {
    TESSERA_RETURN_IF_ERROR(ckpt->OpenSingle((dir / kSingleFile).string()));
  } else if (IsFile(dir / kIndexFile)) {
    TESSERA_RETURN_IF_ERROR(ckpt->OpenIndex((dir / kIndexFile).string()));
  } else {
    return NotFound(model_dir + ": no checkpoint: neither " + kSingleFile + " nor " + kIndexFile +
                    " exists");
  }
  return ckpt;
}

Status Checkpoint::OpenSingle(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  for (const TensorInfo& t : file->tensors()) tensors_[t.name] = Location{file.get(), &t};
  files_.push_back(std::move(file));
  return Status::Ok();
}

Status Checkpoint::OpenIndex(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return IoError(index_path + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  json root;
  try {
    root = json::parse(ss.str());
  } catch (const json::exception& e) {
    return InvalidArgument(index_path + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) return InvalidArgument(index_path + ": not a JSON object");
  auto wm = root.find("weight_map");
  if (wm == root.end() || !wm->is_object()) {
    return InvalidArgument(index_path + ": key 'weight_map' is missing or not an object");
  }
  // Tensor -> shard file name, checked before any shard is opened.
  std::map<std::string, std::string> shard_of;
  std::set<std::string> shard_names;
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string()) {
      return InvalidArgument(index_path + ": key 'weight_map." + tensor + "' is not a string");
    }
    const std::string name = file.get<std::string>();
    const fs::path rel(name);
    bool escapes = name.empty() || rel.is_absolute();
    for (const auto& part : rel) escapes = escapes || part == "..";
    if (escapes) {
      return InvalidArgument(index_path + ": key 'weight_map." + tensor + "' names shard '" + name +
                             "', which is not a file inside the model directory");
    }
    shard_of[tensor] = name;
    shard_names.insert(name);
  }
  const fs::path dir(dir_);
  std::map<std::string, const SafetensorsFile*> shards;
  for (const std::string& name : shard_names) {
    const std::string path = (dir / name).string();
    if (!IsFile(path)) {
      return NotFound(path + ": shard file named in " + index_path + " does not exist");
    }
    TESSERA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    shards[name] = file.get();
    files_.push_back(std::move(file));
  }
  for (const auto& [tensor, name] : shard_of) {
    const SafetensorsFile* file = shards.at(name);
    const TensorInfo* info = file->Find(tensor);
    if (info == nullptr) {
      return NotFound(index_path + ": tensor '" + tensor + "' is assigned to shard " +
                      file->path() + ", which does not contain it");
    }
    tensors_[tensor] = Location{file, info};
  }
  return Status::Ok();
}

StatusOr<Checkpoint::Location> Checkpoint::Locate(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return NotFound("tensor '" + name + "' is not in checkpoint " + dir_);
  }
  return it->second;
}

StatusOr<TensorInfo> Checkpoint::Find(const std::string& name) const {
  TESSERA_ASSIGN_OR_RETURN(Location loc, Locate(name));
  return *loc.info;
}

bool Checkpoint::Has(const std::string& name) const { return tensors_.count(name) != 0; }

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) names.push_back(name);
  return names;
}

int64_t Checkpoint::BytesRead() const {
  int64_t total = 0;
  for (const auto& f : files_) total += f->BytesRead();
  return total;
}

Status Checkpoint::ReadAll(const std::string& name, DType out_dtype, void* dst) const {
  TESSERA_ASSIGN_OR_RETURN(Location loc, Locate(name));
  if (loc.info->shape.empty()) {  // a scalar has no dim 0: one run of one element
    return ReadRuns(loc, Runs{loc.info->data_begin, loc.info->nbytes, loc.info->nbytes, 1},
                    out_dtype, dst);
  }
  return ReadSlice(name, 0, 0, loc.info->shape[0], out_dtype, dst);
}

Status Checkpoint::ReadSlice(const std::string& name, int dim, int64_t begin, int64_t end,
                             DType out_dtype, void* dst) const {
  return ReadSliceRows(name, dim, begin, end, 0, -1, out_dtype, dst);
}

// outer_end < 0: every outer index.
Status Checkpoint::ReadSliceRows(const std::string& name, int dim, int64_t begin, int64_t end,
                                 int64_t outer_begin, int64_t outer_end, DType out_dtype,
                                 void* dst) const {
  TESSERA_ASSIGN_OR_RETURN(Location loc, Locate(name));
  const TensorInfo& t = *loc.info;
  const int rank = static_cast<int>(t.shape.size());
  if (dim < 0 || dim >= rank) {
    return InvalidArgument("tensor '" + name + "' of shape " + t.ShapeString() + " in " + t.file +
                           ": cannot slice dim " + std::to_string(dim) + " (rank " +
                           std::to_string(rank) + ")");
  }
  if (begin < 0 || begin > end || end > t.shape[dim]) {
    return OutOfRange("tensor '" + name + "' of shape " + t.ShapeString() + " in " + t.file +
                      ": range [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") is outside dim " + std::to_string(dim) + " (size " +
                      std::to_string(t.shape[dim]) + ")");
  }
  // outer = product of dims before `dim`, inner = product after, in bytes.
  uint64_t outer = 1;
  for (int i = 0; i < dim; ++i) outer *= static_cast<uint64_t>(t.shape[i]);
  if (outer_end < 0) outer_end = static_cast<int64_t>(outer);
  if (outer_begin < 0 || outer_begin > outer_end || static_cast<uint64_t>(outer_end) > outer) {
    return OutOfRange("tensor '" + name + "' of shape " + t.ShapeString() + " in " + t.file +
                      ": rows [" + std::to_string(outer_begin) + ", " + std::to_string(outer_end) +
                      ") of the dim-" + std::to_string(dim) + " slice are outside its " +
                      std::to_string(outer) + " rows");
  }
  uint64_t inner_bytes = DTypeSize(t.dtype);
  for (int i = dim + 1; i < rank; ++i) inner_bytes *= static_cast<uint64_t>(t.shape[i]);
  const uint64_t dim_size = static_cast<uint64_t>(t.shape[dim]);
  Runs runs;
  runs.stride = dim_size * inner_bytes;
  runs.offset = t.data_begin + static_cast<uint64_t>(outer_begin) * runs.stride +
                static_cast<uint64_t>(begin) * inner_bytes;
  runs.run_bytes = static_cast<uint64_t>(end - begin) * inner_bytes;
  runs.count = static_cast<uint64_t>(outer_end - outer_begin);
  if (runs.run_bytes == runs.stride || runs.count <= 1) {  // contiguous: one run
    runs.run_bytes *= runs.count;
    runs.stride = runs.run_bytes;
    runs.count = 1;
  }
  return ReadRuns(loc, runs, out_dtype, dst);
}

Status Checkpoint::ReadSliceAt(const std::string& name, int64_t index, int dim, int64_t begin,
                               int64_t end, DType out_dtype, void* dst) const {
  TESSERA_ASSIGN_OR_RETURN(Location loc, Locate(name));
  const TensorInfo& t = *loc.info;
  const int rank = static_cast<int>(t.shape.size());
  if (rank < 2 || dim < 1 || dim >= rank) {
    return InvalidArgument("tensor '" + name + "' of shape " + t.ShapeString() + " in " + t.file +
                           ": cannot slice dim " + std::to_string(dim) + " of one entry (rank " +
                           std::to_string(rank) + ")");
  }
  if (index < 0 || index >= t.shape[0]) {
    return OutOfRange("tensor '" + name + "' of shape " + t.ShapeString() + " in " + t.file +
                      ": entry " + std::to_string(index) + " is outside dim 0");
  }
  if (begin < 0 || begin > end || end > t.shape[dim]) {
    return OutOfRange("tensor '" + name + "' of shape " + t.ShapeString() + " in " + t.file +
                      ": range [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") is outside dim " + std::to_string(dim) + " (size " +
                      std::to_string(t.shape[dim]) + ")");
  }
  // Entry `index` is the outer rows [index * per_entry, (index + 1) * per_entry) of the
  // dim-`dim` slice, per_entry = the product of dims 1 .. dim-1.
  int64_t per_entry = 1;
  for (int i = 1; i < dim; ++i) per_entry *= t.shape[i];
  return ReadSliceRows(name, dim, begin, end, index * per_entry, (index + 1) * per_entry,
                       out_dtype, dst);
}

Status Checkpoint::ReadRuns(const Location& loc, const Runs& runs, DType out_dtype,
                            void* dst) const {
  const TensorInfo& t = *loc.info;
  const bool raw = out_dtype == t.dtype;
  if (!raw && !(out_dtype == DType::kF32 &&
                (t.dtype == DType::kF16 || t.dtype == DType::kBF16 || t.dtype == DType::kF8E4M3))) {
    return InvalidArgument("tensor '" + t.name + "' in " + t.file + ": cannot convert " +
                           DTypeName(t.dtype) + " to " + DTypeName(out_dtype) +
                           " (supported: the source dtype, or F32 from F32/F16/BF16/F8_E4M3)");
  }
  if (runs.run_bytes == 0 || runs.count == 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgument("tensor '" + t.name + "': null destination");

  if (raw) {  // pread straight into dst: no staging, no extra copy
    auto* out = static_cast<uint8_t*>(dst);
    for (uint64_t i = 0; i < runs.count; ++i) {
      TESSERA_RETURN_IF_ERROR(loc.file->ReadBytes(runs.offset + i * runs.stride, runs.run_bytes,
                                                  out + i * runs.run_bytes));
    }
    return Status::Ok();
  }

  // Convert F16/BF16/F8_E4M3 -> F32 through one reused staging buffer: fill it with
  // run pieces (element-aligned: the capacity and every run are multiples of
  // the element size), convert, repeat.
  const size_t esize = DTypeSize(t.dtype);
  std::unique_ptr<uint8_t[]> staging = TakeStaging();
  float* out = static_cast<float*>(dst);
  uint64_t used = 0;
  auto flush = [&] {
    ConvertToF32(t.dtype, staging.get(), out, used / esize);
    out += used / esize;
    used = 0;
  };
  Status status;
  for (uint64_t i = 0; i < runs.count && status.ok(); ++i) {
    uint64_t offset = runs.offset + i * runs.stride;
    uint64_t left = runs.run_bytes;
    // Keep a run that fits the buffer in one pread.
    if (left <= staging_bytes_ && used + left > staging_bytes_) flush();
    while (left > 0) {
      const uint64_t chunk = std::min<uint64_t>(left, staging_bytes_ - used);
      status = loc.file->ReadBytes(offset, chunk, staging.get() + used);
      if (!status.ok()) break;
      used += chunk;
      offset += chunk;
      left -= chunk;
      if (used == staging_bytes_) flush();
    }
  }
  if (status.ok() && used > 0) flush();
  ReturnStaging(std::move(staging));
  return status;
}

std::unique_ptr<uint8_t[]> Checkpoint::TakeStaging() const {
  {
    std::lock_guard<std::mutex> lock(staging_mu_);
    if (!staging_pool_.empty()) {
      std::unique_ptr<uint8_t[]> buf = std::move(staging_pool_.back());
      staging_pool_.pop_back();
      return buf;
    }
  }
  return std::unique_ptr<uint8_t[]>(new uint8_t[staging_bytes_]);
}

void Checkpoint::ReturnStaging(std::unique_ptr<uint8_t[]> buf) const {
  std::lock_guard<std::mutex> lock(staging_mu_);
  staging_pool_.push_back(std::move(buf));
}

}  // namespace tessera
