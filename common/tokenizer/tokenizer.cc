#include "common/tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "common/base/json_ref.h"
#include "common/base/utf8.h"

namespace tessera {

namespace {

// Reads a whole file. Errors: kNotFound when it does not exist, kIoError when
// it cannot be read.
StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound(fmt::format("{}: file not found", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(fmt::format("{}: cannot open for reading", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(fmt::format("{}: read failed", path));
  return ss.str();
}

// A tokenizer_config.json token field: a string, {"content": "..."}, or
// null/absent (returns "").
StatusOr<std::string> ReadTokenField(const JsonRef& root, std::string_view key) {
  if (!root.Has(key)) return std::string();
  const JsonRef node = root.Child(key);
  if (node.node().is_string()) return node.AsString();
  if (node.node().is_object()) return node.GetString("content");
  return node.Error("expected a string or an object with \"content\"");
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  const std::string tokenizer_path = (std::filesystem::path(model_dir) / "tokenizer.json").string();
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(tokenizer_path));
  TESSERA_RETURN_IF_ERROR(tok->LoadTokenizerJson(text, tokenizer_path));

  const std::string config_path =
      (std::filesystem::path(model_dir) / "tokenizer_config.json").string();
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    TESSERA_ASSIGN_OR_RETURN(std::string config, ReadWholeFile(config_path));
    TESSERA_RETURN_IF_ERROR(tok->LoadTokenizerConfig(config, config_path));
  }
  if (tok->chat_template_.empty()) {
    const std::string jinja = (std::filesystem::path(model_dir) / "chat_template.jinja").string();
    if (std::filesystem::exists(jinja, ec)) {
      TESSERA_ASSIGN_OR_RETURN(tok->chat_template_, ReadWholeFile(jinja));
    }
  }
  return tok;
}

Status Tokenizer::LoadTokenizerJson(const std::string& text, const std::string& file) {
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, file));
  const JsonRef root(doc, file, "");
  TESSERA_RETURN_IF_ERROR(root.ExpectObject());
  TESSERA_ASSIGN_OR_RETURN(JsonRef model, root.Required("model"));
  TESSERA_ASSIGN_OR_RETURN(model_, BpeModel::FromJson(model));
  TESSERA_ASSIGN_OR_RETURN(normalizer_, ParseNormalizer(root.Child("normalizer")));
  TESSERA_ASSIGN_OR_RETURN(pre_tokenizer_, ParsePreTokenizer(root.Child("pre_tokenizer")));
  TESSERA_ASSIGN_OR_RETURN(decoder_, ParseTokenDecoder(root.Child("decoder")));
  TESSERA_ASSIGN_OR_RETURN(PostProcessor post, ParsePostProcessor(root.Child("post_processor")));
  post_processor_.emplace(std::move(post));
  TESSERA_ASSIGN_OR_RETURN(
      AddedVocabulary added,
      AddedVocabulary::FromJson(root.Child("added_tokens"), normalizer_.get()));
  added_.emplace(std::move(added));
  // "truncation" and "padding" are ignored: serving never truncates or pads
  // a prompt, as transformers disables both unless asked per call.

  // Vocabulary size and the special-token table.
  // One past every id: a vocab with holes (ids past its entry count) included.
  size_t max_id = std::max(model_->vocab_size(), model_->id_limit());
  for (const auto& t : added_->tokens()) max_id = std::max(max_id, static_cast<size_t>(t.id) + 1);
  special_.assign(max_id, false);
  int64_t distinct = static_cast<int64_t>(model_->vocab_size());
  std::unordered_set<std::string> counted;
  for (const auto& t : added_->tokens()) {
    if (t.special) special_[t.id] = true;
    if (!model_->TokenToId(t.content) && counted.insert(t.content).second) ++distinct;
  }
  for (const auto& t : added_->tokens()) {
    if (!t.special) continue;
    if (auto id = model_->TokenToId(t.content)) special_[*id] = true;
  }
  vocab_size_ = static_cast<int32_t>(std::max(distinct, static_cast<int64_t>(max_id)));
  bool fused = false;
  window_decode_safe_ = !decoder_ || decoder_->WindowSafe(fused);
  return Status::Ok();
}

Status Tokenizer::LoadTokenizerConfig(const std::string& text, const std::string& file) {
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, file));
  const JsonRef root(doc, file, "");
  TESSERA_RETURN_IF_ERROR(root.ExpectObject());

  TESSERA_ASSIGN_OR_RETURN(bos_token_, ReadTokenField(root, "bos_token"));
  TESSERA_ASSIGN_OR_RETURN(eos_token_, ReadTokenField(root, "eos_token"));
  if (!bos_token_.empty()) {
    bos_id_ = TokenToId(bos_token_);
    if (!bos_id_) {
      return root.Child("bos_token")
          .Error(fmt::format("token '{}' is not in the vocabulary", bos_token_));
    }
  }
  if (!eos_token_.empty()) {
    eos_id_ = TokenToId(eos_token_);
    if (!eos_id_) {
      return root.Child("eos_token")
          .Error(fmt::format("token '{}' is not in the vocabulary", eos_token_));
    }
  }

  if (root.Has("add_bos_token") || root.Has("add_eos_token")) {
    auto contains = [](const std::vector<int32_t>& v, std::optional<int32_t> id) {
      return id && std::find(v.begin(), v.end(), *id) != v.end();
    };
    TESSERA_ASSIGN_OR_RETURN(
        bool add_bos,
        root.GetBoolOr("add_bos_token", contains(post_processor_->PrefixIds(), bos_id_)));
    TESSERA_ASSIGN_OR_RETURN(
        bool add_eos,
        root.GetBoolOr("add_eos_token", contains(post_processor_->SuffixIds(), eos_id_)));
    if (add_bos && !bos_id_)
      return root.Child("add_bos_token").Error("true but bos_token is not set");
    if (add_eos && !eos_id_)
      return root.Child("add_eos_token").Error("true but eos_token is not set");
    std::vector<PostProcessor::Piece> pieces;
    if (add_bos) pieces.push_back({false, {*bos_id_}});
    pieces.push_back({true, {}});
    if (add_eos) pieces.push_back({false, {*eos_id_}});
    post_processor_.emplace(std::move(pieces));
  }

  if (root.Has("chat_template")) {
    const JsonRef ct = root.Child("chat_template");
    if (ct.node().is_string()) {
      TESSERA_ASSIGN_OR_RETURN(chat_template_, ct.AsString());
    } else if (ct.node().is_array()) {
      // [{"name": ..., "template": ...}]: the "default" entry, else the first.
      for (size_t i = 0; i < ct.node().size(); ++i) {
        const JsonRef entry = ct.At(i);
        TESSERA_ASSIGN_OR_RETURN(std::string name, entry.GetString("name"));
        TESSERA_ASSIGN_OR_RETURN(std::string body, entry.GetString("template"));
        if (name == "default" || (i == 0)) chat_template_ = std::move(body);
        if (name == "default") break;
      }
    } else {
      return ct.Error("expected a string or a list of {\"name\", \"template\"} objects");
    }
  }
  return Status::Ok();
}

void Tokenizer::EncodeStretch(std::string_view stretch, size_t orig_start,
                              std::vector<int32_t>& ids) const {
  std::string normalized(stretch);
  if (normalizer_) normalizer_->Normalize(normalized);
  for (const auto& seg : added_->Split(normalized, /*normalized=*/true)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::vector<PreToken> pieces;
    pieces.push_back({normalized.substr(seg.begin, seg.end - seg.begin), orig_start + seg.begin});
    if (pre_tokenizer_) pre_tokenizer_->PreTokenize(pieces);
    for (const auto& p : pieces) model_->Tokenize(p.text, ids);
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string cleaned;
  if (!IsValidUtf8(text)) {
    cleaned = Utf8Lossy(text);
    text = cleaned;
  }
  std::vector<int32_t> ids;
  for (const auto& seg : added_->Split(text, /*normalized=*/false)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      EncodeStretch(text.substr(seg.begin, seg.end - seg.begin), seg.begin, ids);
    }
  }
  return post_processor_->Process(std::move(ids), add_special_tokens);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return Decode(ids.data(), ids.size(), skip_special_tokens);
}

const std::string* Tokenizer::DecodedToken(int32_t id, bool skip_special_tokens) const {
  if (skip_special_tokens && IsSpecial(id)) return nullptr;
  if (const AddedToken* t = added_->FindById(id)) return &t->match_content;
  return model_->IdToToken(id);
}

size_t Tokenizer::FinalIdCount(const int32_t* ids, size_t n, bool skip_special_tokens) const {
  if (!decoder_ || !decoder_->UsesByteFallback()) return n;
  size_t k = n;
  while (k > 0) {
    const std::string* t = DecodedToken(ids[k - 1], skip_special_tokens);
    if (t != nullptr && ByteFallbackValue(*t) < 0) break;
    --k;
  }
  return k;
}

std::string Tokenizer::Decode(const int32_t* ids, size_t n, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (const std::string* t = DecodedToken(ids[i], skip_special_tokens)) tokens.push_back(*t);
  }
  if (decoder_) return decoder_->Decode(std::move(tokens));
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.push_back(' ');
    out += tokens[i];
  }
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = added_->FindByContent(token)) return id;
  return model_->TokenToId(token);
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (const AddedToken* t = added_->FindById(id)) return t->content;
  const std::string* s = model_->IdToToken(id);
  if (s == nullptr) return {};
  return decoder_ ? decoder_->TokenBytes(*s) : *s;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* t = added_->FindById(id)) return t->match_content;
  if (const std::string* s = model_->IdToToken(id)) return *s;
  return std::string();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

namespace {
bool EndsWithReplacement(const std::string& s) {
  return s.size() >= kUtf8Replacement.size() &&
         std::string_view(s).substr(s.size() - kUtf8Replacement.size()) == kUtf8Replacement;
}
}  // namespace

std::string IncrementalDecoder::AdvanceFull(size_t n, bool final_call) {
  const std::string full = tokenizer_.Decode(ids_.data(), n, skip_special_tokens_);
  if (!final_call && EndsWithReplacement(full)) return std::string();
  size_t from = emitted_.size();
  if (full.compare(0, emitted_.size(), emitted_) != 0) {
    // Cannot happen with the supported decoders; never split a character.
    from = std::min(from, full.size());
    while (from < full.size() && (static_cast<unsigned char>(full[from]) & 0xC0) == 0x80) ++from;
  }
  std::string out = full.substr(std::min(from, full.size()));
  emitted_ = full;
  prefix_ = 0;
  read_ = n;
  prefix_text_ = full;
  return out;
}

std::string IncrementalDecoder::Advance(size_t n, bool final_call) {
  if (n <= read_) return std::string();
  if (!tokenizer_.window_decode_safe_) return AdvanceFull(n, final_call);
  const std::string text =
      tokenizer_.Decode(ids_.data() + prefix_, n - prefix_, skip_special_tokens_);
  if (!final_call && EndsWithReplacement(text)) return std::string();
  if (text.compare(0, prefix_text_.size(), prefix_text_) != 0) return AdvanceFull(n, final_call);
  std::string out = text.substr(prefix_text_.size());
  emitted_ += out;
  // Move the window start to the old read position (a clean checkpoint: its
  // text was complete) unless the ids since then decode to nothing, in which
  // case start-of-text rules could still reach the next ids.
  std::string next_prefix = tokenizer_.Decode(ids_.data() + read_, n - read_, skip_special_tokens_);
  if (!next_prefix.empty()) {
    prefix_ = read_;
    prefix_text_ = std::move(next_prefix);
  } else {
    prefix_text_ = text;
  }
  read_ = n;
  return out;
}

std::string IncrementalDecoder::Push(int32_t id) {
  ids_.push_back(id);
  return Advance(tokenizer_.FinalIdCount(ids_.data(), ids_.size(), skip_special_tokens_), false);
}

std::string IncrementalDecoder::Flush() {
  std::string out = Advance(ids_.size(), true);
  ids_.clear();
  prefix_ = 0;
  read_ = 0;
  prefix_text_.clear();
  emitted_.clear();
  return out;
}

}  // namespace tessera
