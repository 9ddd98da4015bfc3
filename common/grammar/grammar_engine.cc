#include "common/grammar/grammar_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tessera {

namespace {

// LLGuidance's marker for a special token's bytes (toktrie's special-token prefix).
constexpr char kSpecialTokenMarker = '\xff';

// LlgTokenizeFn over Tokenizer::Encode (thread-safe, as LLGuidance requires).
size_t TokenizeWithTessera(const void* user_data, const uint8_t* bytes, size_t bytes_len,
                           uint32_t* out, size_t out_len) {
  const auto* tokenizer = static_cast<const Tokenizer*>(user_data);
  const std::vector<int32_t> ids =
      tokenizer->Encode(std::string_view(reinterpret_cast<const char*>(bytes), bytes_len), false);
  for (size_t i = 0; i < ids.size() && i < out_len; ++i) out[i] = static_cast<uint32_t>(ids[i]);
  return ids.size();
}

// Whether Encode spells a text fragment with exactly its bytes (byte-level
// BPE does; a tokenizer that adds a word-start space to every text does not).
bool EncodesFragmentsExactly(const Tokenizer& tokenizer) {
  for (const std::string_view fragment : {"{", "\"a\": [1, 2]}", "x"}) {
    std::string spelled;
    for (int32_t id : tokenizer.Encode(fragment, false)) spelled += tokenizer.TokenBytes(id);
    if (spelled != fragment) return false;
  }
  return true;
}

// LLGuidance's error text up to the dump of its parser state ("\n<state>"
// and many lines of internals), which a client or a log line does not need.
std::string WithoutParserState(std::string_view error) {
  return std::string(error.substr(0, error.find("\n<state>")));
}

}  // namespace

GrammarMatcher::~GrammarMatcher() { lib_->free_matcher(matcher_); }

std::string GrammarMatcher::Error() {
  const char* e = lib_->matcher_get_error(matcher_);
  return e != nullptr ? WithoutParserState(e) : "unknown LLGuidance error";
}

Status GrammarMatcher::ComputeMask(std::vector<uint32_t>& mask) {
  mask.resize(mask_words_);
  if (lib_->matcher_compute_mask_into(matcher_, mask.data(), mask_words_ * sizeof(uint32_t)) != 0)
    return Internal("grammar: computing the token mask failed: " + Error());
  return Status::Ok();
}

Status GrammarMatcher::Accept(int32_t token) {
  if (token == eos_id_) {  // the mask stays the last one: EOS alone
    ended_ = true;
    return Status::Ok();
  }
  if (token < 0 || lib_->matcher_consume_token(matcher_, static_cast<uint32_t>(token)) != 0)
    return InvalidArgument("grammar: token " + std::to_string(token) +
                           " does not continue the output: " + Error());
  return Status::Ok();
}

StatusOr<std::shared_ptr<const GrammarEngine>> GrammarEngine::Create(
    std::shared_ptr<const LlguidanceLibrary> lib, std::shared_ptr<const Tokenizer> tokenizer,
    int32_t vocab_size, int32_t eos_id) {
  if (eos_id < 0 || eos_id >= vocab_size)
    return InvalidArgument("grammar: eos id " + std::to_string(eos_id) +
                           " is outside the vocab [0, " + std::to_string(vocab_size) + ")");
  std::vector<uint32_t> lens(static_cast<size_t>(vocab_size), 0);
  std::string bytes;
  for (int32_t id = 0; id < vocab_size; ++id) {
    std::string b = id < tokenizer->vocab_size() ? tokenizer->TokenBytes(id) : std::string();
    if (tokenizer->IsSpecial(id) || id == eos_id) b.insert(b.begin(), kSpecialTokenMarker);
    lens[static_cast<size_t>(id)] = static_cast<uint32_t>(b.size());
    bytes += b;
  }
  LlgTokenizerInit init;
  std::memset(&init, 0, sizeof(init));
  init.vocab_size = static_cast<uint32_t>(vocab_size);
  init.tok_eos = static_cast<uint32_t>(eos_id);
  init.token_lens = lens.data();
  init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  if (EncodesFragmentsExactly(*tokenizer)) {
    init.tokenize_assumes_string = true;  // Encode reads its input as UTF-8 text
    init.tokenize_fn = &TokenizeWithTessera;
    init.tokenize_user_data = tokenizer.get();
  } else {
    // A SentencePiece-style tokenizer puts its word-start space before every
    // text it encodes ("{" -> "▁", "{"), so its Encode cannot tokenize the
    // bytes a grammar forces mid-output: LLGuidance would allow the space
    // token and then refuse it. Its greedy tokenizer over the token bytes
    // gives token sequences that spell exactly those bytes.
    init.use_approximate_greedy_tokenize_fn = true;
  }
  char error[1024] = {0};
  LlgTokenizer* t = lib->new_tokenizer(&init, error, sizeof(error));
  if (t == nullptr)
    return FailedPrecondition(std::string("grammar: LLGuidance refused the vocabulary: ") + error);
  std::shared_ptr<GrammarEngine> engine(new GrammarEngine());
  engine->lib_ = std::move(lib);
  engine->tokenizer_ = std::move(tokenizer);
  engine->llg_tokenizer_ = t;
  engine->vocab_size_ = vocab_size;
  engine->eos_id_ = eos_id;
  return std::shared_ptr<const GrammarEngine>(std::move(engine));
}

GrammarEngine::~GrammarEngine() { lib_->free_tokenizer(llg_tokenizer_); }

const char* GrammarEngine::ConstraintType(const GrammarSpec& spec) {
  return spec.kind == GrammarKind::kLark ? "lark" : "json_schema";
}

LlgConstraintInit GrammarEngine::Init() const {
  LlgConstraintInit init;
  std::memset(&init, 0, sizeof(init));
  lib_->constraint_init_set_defaults(&init, llg_tokenizer_);
  init.log_stderr_level = 0;  // errors come back as statuses
  return init;
}

StatusOr<std::string> GrammarEngine::GrammarData(const GrammarSpec& spec) {
  if (spec.kind == GrammarKind::kLark) return spec.schema;
  // ordered_json: LLGuidance generates an object's properties in the order
  // the schema lists them, which must stay the client's (nlohmann::json
  // would sort them by name).
  nlohmann::ordered_json schema;
  if (spec.kind == GrammarKind::kJsonObject) {
    schema = {{"type", "object"}};
  } else if (spec.kind == GrammarKind::kJsonSchema) {
    schema = nlohmann::ordered_json::parse(spec.schema, nullptr, false);
    if (schema.is_discarded()) return InvalidArgument("the schema is not valid JSON");
    if (!schema.is_object() && !schema.is_boolean())
      return InvalidArgument("the schema must be a JSON object");
  } else {
    return InvalidArgument("no grammar");
  }
  if (schema.is_object()) schema["x-guidance"] = {{"whitespace_flexible", false}};
  return schema.dump();
}

Status GrammarEngine::Check(const GrammarSpec& spec) const {
  // A compiled grammar is not yet a usable one: a schema whose every path
  // recurses without producing output ({"$ref": "#"}, two $defs naming each
  // other) compiles, and LLGuidance fails it on the first mask; one that
  // requires itself ({"properties": {"a": {"$ref": "#"}}, "required": ["a"]})
  // fails a mask or two later. So the check follows the grammar for a few
  // tokens, as the sampling worker will: the lowest allowed token id each
  // time, until only EOS is allowed or kCheckTokens were taken.
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GrammarMatcher> matcher, NewMatcher(spec));
  std::vector<uint32_t> mask;
  // `token`: the 1-based token of the output at which LLGuidance failed.
  const auto failed = [&](int token) {
    return InvalidArgument(fmt::format(
        "LLGuidance compiles it but fails at token {} of the output: {}", token, matcher->Error()));
  };
  for (int taken = 0; taken < kCheckTokens; ++taken) {
    if (!matcher->ComputeMask(mask).ok()) {
      if (taken == 0)
        return InvalidArgument("LLGuidance compiles it but cannot start an output under it: " +
                               matcher->Error());
      return failed(taken + 1);
    }
    int32_t next = -1;
    for (size_t w = 0; w < mask.size() && next < 0; ++w) {
      uint32_t bits = mask[w];
      if (w == static_cast<size_t>(eos_id_) / 32) bits &= ~(1u << (eos_id_ % 32));
      if (bits != 0) next = static_cast<int32_t>(w * 32 + std::countr_zero(bits));
    }
    if (next < 0) {
      if (taken == 0 && !((mask[eos_id_ / 32] >> (eos_id_ % 32)) & 1u))
        return InvalidArgument("no token can start an output under it");
      return Status::Ok();  // complete: EOS alone
    }
    // LLGuidance may fail on consuming a token its mask allowed (computing
    // what the token forces next).
    if (!matcher->Accept(next).ok()) return failed(taken + 1);
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<GrammarMatcher>> GrammarEngine::NewMatcher(const GrammarSpec& spec) const {
  TESSERA_ASSIGN_OR_RETURN(std::string data, GrammarData(spec));
  const LlgConstraintInit init = Init();
  LlgMatcher* m = lib_->new_matcher(&init, ConstraintType(spec), data.c_str());
  if (const char* e = lib_->matcher_get_error(m)) {
    Status error = InvalidArgument(WithoutParserState(e));
    lib_->free_matcher(m);
    return error;
  }
  const size_t words =
      (lib_->matcher_get_mask_byte_size(m) + sizeof(uint32_t) - 1) / sizeof(uint32_t);
  return std::unique_ptr<GrammarMatcher>(new GrammarMatcher(lib_, m, words, eos_id_));
}

}  // namespace tessera
