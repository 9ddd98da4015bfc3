#include "common/base/tensor.h"

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

namespace tessera {

const char* DeviceName(Device device) { return device == Device::kCPU ? "cpu" : "cuda"; }

static int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::Empty(std::vector<int64_t> shape, DType dtype) {
  for (int64_t d : shape) TESSERA_CHECK(d >= 0);
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = Device::kCPU;
  size_t bytes = t.nbytes();
  size_t padded = (bytes + 63) / 64 * 64;
  if (padded == 0) padded = 64;
  void* p = std::aligned_alloc(64, padded);
  TESSERA_CHECK(p != nullptr);
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::Zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t = Empty(std::move(shape), dtype);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::Wrap(void* data, std::vector<int64_t> shape, DType dtype, Device device,
                    std::shared_ptr<void> owner) {
  Tensor t;
  t.storage_ = owner ? std::move(owner) : std::shared_ptr<void>(data, [](void*) {});
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += rank();
  TESSERA_CHECK(i >= 0 && i < rank());
  return shape_[static_cast<size_t>(i)];
}

int64_t Tensor::numel() const { return Product(shape_); }

Tensor Tensor::Slice0(int64_t begin, int64_t end) const {
  TESSERA_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0]);
  Tensor t = *this;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * DTypeSize(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::Reshape(std::vector<int64_t> shape) const {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TESSERA_CHECK(infer == -1);
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) shape[static_cast<size_t>(infer)] = known == 0 ? 0 : numel() / known;
  TESSERA_CHECK(Product(shape) == numel());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

std::string Tensor::Describe() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? ", " : "") << shape_[i];
  os << "] " << DTypeName(dtype_) << " " << DeviceName(device_);
  return os.str();
}

}  // namespace tessera
