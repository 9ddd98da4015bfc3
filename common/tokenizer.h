// Placeholder declaration; replaced by the tok branch.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include "common/status.h"
namespace tessera {
class Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  std::optional<int32_t> eos_id() const;
  const std::string& chat_template() const;
};
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer&, bool skip_special_tokens = true);
  std::string Push(int32_t id);
  std::string Flush();
};
}  // namespace tessera
