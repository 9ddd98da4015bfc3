// Normalizer: the first text transform of a Hugging Face tokenizer pipeline
// (tokenizer.json "normalizer"). It rewrites each stretch of input between
// added tokens before pre-tokenization.
//
// Supported types (as in the `tokenizers` library): Sequence, Prepend,
// Replace (String or Regex pattern), NFC, NFD, NFKC, NFKD (via ICU).
//
// Thread-safety: immutable after parsing; Normalize may run concurrently.
#pragma once

#include <memory>
#include <string>

#include "common/base/json_ref.h"
#include "common/base/status.h"

namespace tessera {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8) in place; the result is valid UTF-8.
  virtual void Normalize(std::string& text) const = 0;
};

// Builds the normalizer described by `node` (tokenizer.json "normalizer").
// A JSON null yields nullptr (no normalization). Errors: kUnimplemented naming
// the JSON path and listing the supported types; kInvalidArgument for a
// missing or mistyped field or a regex that does not compile.
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const JsonRef& node);

}  // namespace tessera
