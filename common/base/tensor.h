// Tensor: a dense, row-major, reference-counted buffer with a dtype, a device
// and a shape.
//
// Strides are implicit: element (i0, i1, ..., in) of a tensor with shape
// (d0, d1, ..., dn) lives at linear index ((i0 * d1 + i1) * d2 + ...) * ... + in.
// That formula is the only layout Tensor knows; views produced by Slice0 and
// Reshape share storage and stay contiguous.
//
// Thread-safety: a Tensor is a handle. Copies share storage; concurrent reads
// are safe, concurrent writes to the same storage need external ordering
// (the owner thread of the device does all writes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/dtype.h"

namespace tessera {

enum class Device : uint8_t { kCPU, kCUDA };

const char* DeviceName(Device device);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised host tensor, 64-byte aligned.
  static Tensor Empty(std::vector<int64_t> shape, DType dtype = DType::kF32);
  // Zero-filled host tensor.
  static Tensor Zeros(std::vector<int64_t> shape, DType dtype = DType::kF32);
  // Wraps memory owned by `owner` (kept alive by the tensor), e.g. device
  // memory from a backend allocator.
  static Tensor Wrap(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                     std::shared_ptr<void> owner);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Size of dimension `i`; negative `i` counts from the end.
  int64_t dim(int i) const;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T>
  T* data() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }

  // Rows [begin, end) along dimension 0, sharing storage.
  Tensor Slice0(int64_t begin, int64_t end) const;
  // Same storage, new shape with the same numel. One dimension may be -1.
  Tensor Reshape(std::vector<int64_t> shape) const;

  // "[3, 128] F32 cpu".
  std::string Describe() const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCPU;
};

}  // namespace tessera
