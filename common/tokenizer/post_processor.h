// PostProcessor: adds the special tokens around an encoded sequence
// (tokenizer.json "post_processor"), e.g. Llama's "<s> $A".
//
// Supported types: TemplateProcessing (the "single" template), ByteLevel
// (offsets only, ids unchanged), Sequence. A JSON null means none.
//
// Thread-safety: immutable after construction; Process may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/json_ref.h"
#include "common/base/status.h"

namespace tessera {

class PostProcessor {
 public:
  // One element of a template: the input sequence, or fixed special ids.
  struct Piece {
    bool is_sequence = false;
    std::vector<int32_t> ids;  // when !is_sequence
  };

  // A template processor: `single` lists pieces in order (exactly one of
  // them the sequence). With no pieces the processor leaves ids unchanged.
  explicit PostProcessor(std::vector<Piece> single) : single_(std::move(single)) {}

  // Returns the ids with the template applied; without add_special_tokens the
  // special pieces are left out (the input comes back unchanged).
  std::vector<int32_t> Process(std::vector<int32_t> ids, bool add_special_tokens) const;

  // Number of special ids Process adds around the sequence.
  size_t num_special_tokens() const;
  // The special ids placed before / after the sequence.
  std::vector<int32_t> PrefixIds() const;
  std::vector<int32_t> SuffixIds() const;

 private:
  std::vector<Piece> single_;
};

// Builds the processor described by `node` (tokenizer.json "post_processor");
// a JSON null yields a processor that adds nothing. A Sequence of processors
// is folded into one template (ByteLevel adds nothing).
// Errors: kUnimplemented naming the JSON path and listing the supported types;
// kInvalidArgument for a malformed template or an unknown special token.
StatusOr<PostProcessor> ParsePostProcessor(const JsonRef& node);

}  // namespace tessera
