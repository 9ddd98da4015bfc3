// Tokenizer: a Hugging Face `tokenizers`-compatible text <-> token-id codec
// for the BPE families Tessera serves, loaded from a model directory's
// tokenizer.json (pipeline) and tokenizer_config.json (bos/eos, chat template).
//
// Encode pipeline (as in the `tokenizers` library):
//   1. split the input on added tokens with normalized=false (they map to
//      their ids and are never BPE'd);
//   2. normalize each remaining stretch, then split it on normalized added
//      tokens;
//   3. pre-tokenize each stretch into pieces (Split/ByteLevel/Digits/Metaspace);
//   4. BPE-encode each piece (merge ranks, byte fallback, unk);
//   5. post-process: add the template's special tokens (e.g. bos).
// Decode maps ids to token strings (optionally dropping special tokens) and
// runs the decoder chain (ByteLevel, or Replace/ByteFallback/Fuse/Strip, or
// Metaspace). Outputs equal the `tokenizers` library's, id for id and byte for
// byte (tests/unit/common/tokenizer/tokenizer_test.cc checks fixtures made by
// tools/make_tokenizer_fixtures.py).
//
// tokenizer_config.json (optional): bos_token / eos_token (a string or
// {"content": ...}), chat_template (a string, or a list of {name, template}
// whose "default" entry is used; chat_template.jinja beside it is read when
// the key is absent), add_bos_token / add_eos_token: when either is present
// the post-processor becomes [bos if add_bos] $A [eos if add_eos], as
// transformers' LlamaTokenizerFast does (a missing flag keeps what
// tokenizer.json's template does).
//
// Thread-safety: a loaded Tokenizer is immutable (its internal BPE cache is
// synchronized); Encode/Decode and the accessors may run concurrently from
// any number of threads. An IncrementalDecoder is single-threaded state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/token_decoder.h"

namespace tessera {

class Tokenizer {
 public:
  // Loads `<model_dir>/tokenizer.json` and, when present,
  // `<model_dir>/tokenizer_config.json` (and chat_template.jinja).
  // Errors: kNotFound / kIoError for a missing or unreadable tokenizer.json;
  // kInvalidArgument naming the file and JSON path for malformed JSON or a
  // bad field; kUnimplemented naming the file, JSON path and the supported
  // choices for an unsupported model, normalizer, pre-tokenizer, decoder or
  // post-processor type.
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);

  // Token ids of `text` (UTF-8; invalid bytes are first replaced by U+FFFD,
  // as a Python str would hold them). With add_special_tokens the
  // post-processor's special tokens (e.g. bos) are added. Special tokens
  // written inside `text` always map to their ids.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids`: valid UTF-8, byte-identical to `tokenizers`' decode. Ids
  // outside the vocabulary are skipped; with skip_special_tokens so are the
  // special added tokens.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  // Same, over ids[0, n).
  std::string Decode(const int32_t* ids, size_t n, bool skip_special_tokens) const;

  // Number of distinct tokens: the model vocab plus added tokens outside it
  // (`tokenizers`' get_vocab_size(with_added_tokens=True)), or one past the largest id
  // when the ids have holes, so that every id Encode returns is below it.
  int32_t vocab_size() const { return vocab_size_; }
  // Ids of tokenizer_config.json's bos_token / eos_token, when set.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // Their contents ("" when unset), e.g. for chat templates.
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

  // Id of a token string (added tokens first, then the model vocab).
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Token string of an id ("" when no token has that id); for an added
  // token with normalized=true, its normalized content (as `tokenizers`).
  std::string IdToToken(int32_t id) const;
  // The bytes token `id` stands for wherever it occurs in a text: the decoder
  // chain's TokenDecoder::TokenBytes of its vocabulary string (GPT-2 byte map,
  // <0xNN>, Metaspace's space), an added token's content as written; "" for
  // an id no token has. For a grammar engine's view of the vocabulary
  // (common/grammar/grammar_engine.h), which must see partial characters.
  std::string TokenBytes(int32_t id) const;
  // True for special added tokens (those skip_special_tokens drops).
  bool IsSpecial(int32_t id) const;
  // The chat template (Jinja source), "" when the model has none.
  const std::string& chat_template() const { return chat_template_; }

 private:
  Tokenizer() = default;
  // Loaders for the two files (`file` names them in errors).
  Status LoadTokenizerJson(const std::string& text, const std::string& file);
  Status LoadTokenizerConfig(const std::string& text, const std::string& file);
  friend class IncrementalDecoder;

  // Normalizes, pre-tokenizes and BPE-encodes one stretch between raw added tokens.
  void EncodeStretch(std::string_view stretch, size_t orig_start, std::vector<int32_t>& ids) const;
  // The token string Decode uses for `id`, or nullptr when Decode drops it.
  const std::string* DecodedToken(int32_t id, bool skip_special_tokens) const;
  // Whether IncrementalDecoder may decode windows (TokenDecoder::WindowSafe).
  bool window_decode_safe_ = true;
  // How many leading ids of ids[0, n) have text that no later id can change:
  // all of them, except a trailing run of <0xNN> tokens when the decoder uses
  // ByteFallback (dropped ids inside the run do not end it).
  size_t FinalIdCount(const int32_t* ids, size_t n, bool skip_special_tokens) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<TokenDecoder> decoder_;
  std::optional<AddedVocabulary> added_;
  std::optional<PostProcessor> post_processor_;
  std::vector<bool> special_;  // index = id

  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::string bos_token_;
  std::string eos_token_;
  std::string chat_template_;
};

// Streaming detokenizer for generation: Push one id at a time and get the text
// it completes. The pieces are always valid UTF-8 and never half a character,
// and Push...Flush concatenated equals Tokenizer::Decode of all the ids.
//
// Text is held back while the decode ends in U+FFFD (an incomplete UTF-8
// character that later ids may finish) and, with a ByteFallback decoder,
// while a run of <0xNN> tokens is open (a later bad byte would turn the whole
// run into U+FFFDs). Each Push decodes only a window: the ids from the last
// clean checkpoint (where all text so far was complete) onwards, and emits
// what the new ids add to the window's text. The window keeps at least one
// id with non-empty text before the new ones, so start-of-text rules (Strip,
// Metaspace) fall inside it; a decoder chain that rewrites text across token
// boundaries (see TokenDecoder::WindowSafe), or a window whose text does not
// extend the previous one, falls back to decoding all ids.
//
// Thread-safety: not thread-safe; one per stream. `tokenizer` must outlive it.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Appends `id`; returns the newly completed text (possibly "").
  std::string Push(int32_t id);
  // Returns whatever is still held back (e.g. a trailing U+FFFD or an open
  // byte run) and resets the decoder for a new sequence.
  std::string Flush();

 private:
  // Emits the text of ids_[0, n) beyond what was emitted, decoding the window
  // [prefix_, n); `final_call` emits even a trailing U+FFFD.
  std::string Advance(size_t n, bool final_call);
  // Fallback: decodes ids_[0, n) whole and emits the part not yet emitted.
  std::string AdvanceFull(size_t n, bool final_call);

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;        // window start: a clean checkpoint
  size_t read_ = 0;          // ids_[0, read_) have been emitted
  std::string prefix_text_;  // Decode(ids_[prefix_, read_))
  std::string emitted_;      // all text returned so far (for the fallback)
};

}  // namespace tessera
