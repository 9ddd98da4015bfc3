// PreTokenizer: splits normalized text into the pieces ("words") that the BPE
// model encodes independently (tokenizer.json "pre_tokenizer").
//
// Supported types, with the semantics of the Hugging Face `tokenizers` library:
//  - Split {pattern: String|Regex, behavior, invert}; behavior is one of
//    Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous.
//  - ByteLevel {add_prefix_space, use_regex}: optional leading space per piece,
//    optional split with the GPT-2 regex, then the GPT-2 byte-to-unicode map.
//  - Digits {individual_digits}: isolates each \p{N} character or each run.
//  - Metaspace {replacement, prepend_scheme: always|first|never, split}.
//  - Sequence {pretokenizers}: applies each in turn.
//
// Thread-safety: immutable after parsing; PreTokenize may run concurrently.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/base/json_ref.h"
#include "common/base/status.h"

namespace tessera {

// One piece of text on its way to the model.
struct PreToken {
  std::string text;   // valid UTF-8
  size_t orig_start;  // byte offset in the input text where the piece starts;
                      // exact for 0 (Metaspace prepend_scheme "first" tests it)
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits, in order; empty pieces are dropped.
  virtual void PreTokenize(std::vector<PreToken>& pieces) const = 0;
};

// Metaspace options shared by the Metaspace pre-tokenizer and decoder.
enum class PrependScheme { kAlways, kFirst, kNever };
struct MetaspaceOptions {
  std::string replacement;  // exactly one character, UTF-8 (usually U+2581)
  PrependScheme prepend_scheme = PrependScheme::kAlways;
};
// Reads "replacement" and "prepend_scheme" (or the older "add_prefix_space"
// flag: true = always, false = never) of a Metaspace node.
// Errors: kInvalidArgument / kUnimplemented naming the JSON path.
StatusOr<MetaspaceOptions> ParseMetaspaceOptions(const JsonRef& node);

// Builds the pre-tokenizer described by `node` (tokenizer.json
// "pre_tokenizer"); a JSON null yields nullptr (the whole text is one piece).
// Errors: kUnimplemented naming the JSON path and listing the supported types
// or behaviors; kInvalidArgument for missing or mistyped fields or a regex
// that does not compile.
StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const JsonRef& node);

}  // namespace tessera
