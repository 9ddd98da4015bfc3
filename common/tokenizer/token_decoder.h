// TokenDecoder: turns a sequence of vocabulary token strings back into text
// (tokenizer.json "decoder"), with the semantics of the Hugging Face
// `tokenizers` library: each decoder maps the token list to a new list
// (decode_chain) and the final list is concatenated.
//
// Supported types: ByteLevel (GPT-2 byte map, then lossy UTF-8), Metaspace,
// Sequence, Replace (String or Regex pattern), ByteFallback (<0xNN> runs to
// UTF-8, one U+FFFD per byte of an invalid run), Fuse, Strip.
//
// Thread-safety: immutable after parsing; Decode may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/json_ref.h"
#include "common/base/status.h"

namespace tessera {

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  // Rewrites `tokens` in place (one decode_chain step).
  virtual void DecodeChain(std::vector<std::string>& tokens) const = 0;
  // DecodeChain, then concatenation. The result is valid UTF-8 when the
  // tokens are.
  std::string Decode(std::vector<std::string> tokens) const;
  // The bytes one vocabulary token stands for wherever it occurs (no
  // start-of-text rule, no lossy UTF-8: a byte-level token may hold part of a
  // character), as a grammar engine needs them (common/grammar/). Default:
  // DecodeChain of the token alone, concatenated.
  virtual std::string TokenBytes(std::string token) const;
  // True when the chain contains ByteFallback: the text of a run of <0xNN>
  // tokens is only final once the run ends (one bad byte turns it all U+FFFD).
  virtual bool UsesByteFallback() const { return false; }
  // True when decoding a window of tokens that starts at a clean boundary
  // gives the same text as the whole sequence does for the tokens after the
  // window's first non-empty stretch, i.e. no step rewrites text across token
  // boundaries: a Replace or Metaspace after a fusing step (Fuse, ByteLevel)
  // is not. `fused` tracks whether an earlier step fused the tokens.
  virtual bool WindowSafe(bool& fused) const {
    (void)fused;
    return true;
  }
};

// The byte of a ByteFallback token "<0xNN>" (as `tokenizers` parses it: NN
// is two hex digits, or "+" and one), or -1 for any other token.
int ByteFallbackValue(std::string_view token);

// Builds the decoder described by `node` (tokenizer.json "decoder"); a JSON
// null yields nullptr (the caller then joins tokens with spaces, as
// `tokenizers` does). Errors: kUnimplemented naming the JSON path and listing
// the supported types; kInvalidArgument for missing or mistyped fields.
StatusOr<std::unique_ptr<TokenDecoder>> ParseTokenDecoder(const JsonRef& node);

}  // namespace tessera
