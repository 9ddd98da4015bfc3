// Token texts for completions logprobs (`tokens` and `text_offset`) that
// index into the choice text: text[text_offset[i] : text_offset[i] +
// len(tokens[i])] == tokens[i] for every tokenizer family.
//
// A token decoded alone is wrong for that purpose: a Metaspace (Llama-2
// style) token loses its leading space ("▁the" alone decodes to "the"), and a
// byte-fallback token <0xNN> alone is half a character. Here token i's text
// is what the choice's incremental detokenizer (IncrementalDecoder, special
// tokens skipped, as the scheduler decodes the choice text) emitted when
// token i arrived: a byte token that completes a character carries the whole
// character, one that leaves it open carries "", and text held back to the
// end (a trailing partial character, an open byte run) goes to the last
// token. The alternatives in top_logprobs stay single-token decodes.
//
// Thread-safety: TokenTextStream is not thread-safe (one per choice); the
// free function is stateless. `tokenizer` must outlive both.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace tessera {

// The texts of `ids` (a choice's generated tokens, in order) as above, cut so
// that their concatenation is a prefix of `text` (the choice text, which a
// stop string may have cut): a token past the cut gets "".
std::vector<std::string> IncrementalTokenTexts(const Tokenizer& tokenizer,
                                               const std::vector<int32_t>& ids,
                                               const std::string& text);

// The same, one token at a time, for a stream.
class TokenTextStream {
 public:
  explicit TokenTextStream(const Tokenizer& tokenizer);
  // The text token `id` completes.
  std::string Push(int32_t id);
  // Text still held back at the end of the choice (belongs to its last token).
  std::string Flush();

 private:
  std::unique_ptr<IncrementalDecoder> decoder_;
};

}  // namespace tessera
