#include "common/tokenizer/post_processor.h"

#include <fmt/format.h>

#include <string>

namespace tessera {

namespace {

constexpr const char* kSupported = "TemplateProcessing, ByteLevel, Sequence";

StatusOr<std::vector<PostProcessor::Piece>> ParseTemplate(const JsonRef& node) {
  TESSERA_ASSIGN_OR_RETURN(JsonRef single, node.Required("single"));
  TESSERA_RETURN_IF_ERROR(single.ExpectArray());
  TESSERA_ASSIGN_OR_RETURN(JsonRef specials, node.Required("special_tokens"));
  TESSERA_RETURN_IF_ERROR(specials.ExpectObject());
  std::vector<PostProcessor::Piece> pieces;
  int sequences = 0;
  for (size_t i = 0; i < single.node().size(); ++i) {
    const JsonRef item = single.At(i);
    TESSERA_RETURN_IF_ERROR(item.ExpectObject());
    PostProcessor::Piece piece;
    if (item.Has("Sequence")) {
      TESSERA_ASSIGN_OR_RETURN(std::string id, item.Child("Sequence").GetString("id"));
      if (id != "A") {
        return item.Child("Sequence")
            .Error(fmt::format("the single-sequence template can only hold sequence A, found '{}'",
                               id));
      }
      piece.is_sequence = true;
      ++sequences;
    } else if (item.Has("SpecialToken")) {
      TESSERA_ASSIGN_OR_RETURN(std::string name, item.Child("SpecialToken").GetString("id"));
      const JsonRef entry = specials.Child(name);
      if (entry.is_null()) {
        return item.Error(fmt::format("special token '{}' is not listed in {}.special_tokens", name,
                                      node.path()));
      }
      TESSERA_ASSIGN_OR_RETURN(JsonRef ids, entry.Required("ids"));
      TESSERA_RETURN_IF_ERROR(ids.ExpectArray());
      for (size_t k = 0; k < ids.node().size(); ++k) {
        TESSERA_ASSIGN_OR_RETURN(int64_t id, ids.At(k).AsInt());
        if (id < 0 || id > INT32_MAX) return ids.At(k).Error("expected a non-negative 32-bit id");
        piece.ids.push_back(static_cast<int32_t>(id));
      }
    } else {
      return item.Error("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
    pieces.push_back(std::move(piece));
  }
  if (sequences != 1) return single.Error("the template must hold sequence A exactly once");
  return pieces;
}

// Template `outer` applied to the output of template `inner`.
std::vector<PostProcessor::Piece> Compose(const std::vector<PostProcessor::Piece>& inner,
                                          const std::vector<PostProcessor::Piece>& outer) {
  if (inner.empty()) return outer;
  if (outer.empty()) return inner;
  std::vector<PostProcessor::Piece> out;
  for (const auto& p : outer) {
    if (p.is_sequence) {
      out.insert(out.end(), inner.begin(), inner.end());
    } else {
      out.push_back(p);
    }
  }
  return out;
}

StatusOr<std::vector<PostProcessor::Piece>> ParsePieces(const JsonRef& node) {
  if (node.is_null()) return std::vector<PostProcessor::Piece>();
  TESSERA_RETURN_IF_ERROR(node.ExpectObject());
  TESSERA_ASSIGN_OR_RETURN(std::string type, node.GetString("type"));
  if (type == "TemplateProcessing") return ParseTemplate(node);
  if (type == "ByteLevel") return std::vector<PostProcessor::Piece>();
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(JsonRef list, node.Required("processors"));
    TESSERA_RETURN_IF_ERROR(list.ExpectArray());
    std::vector<PostProcessor::Piece> pieces;
    for (size_t i = 0; i < list.node().size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(std::vector<PostProcessor::Piece> next, ParsePieces(list.At(i)));
      pieces = Compose(pieces, next);
    }
    return pieces;
  }
  return node.Child("type").Unsupported("post_processor type", type, kSupported);
}

}  // namespace

std::vector<int32_t> PostProcessor::Process(std::vector<int32_t> ids,
                                            bool add_special_tokens) const {
  if (!add_special_tokens || single_.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + num_special_tokens());
  for (const auto& p : single_) {
    if (p.is_sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
  }
  return out;
}

size_t PostProcessor::num_special_tokens() const {
  size_t n = 0;
  for (const auto& p : single_) n += p.ids.size();
  return n;
}

std::vector<int32_t> PostProcessor::PrefixIds() const {
  std::vector<int32_t> out;
  for (const auto& p : single_) {
    if (p.is_sequence) break;
    out.insert(out.end(), p.ids.begin(), p.ids.end());
  }
  return out;
}

std::vector<int32_t> PostProcessor::SuffixIds() const {
  std::vector<int32_t> out;
  bool after = false;
  for (const auto& p : single_) {
    if (after) out.insert(out.end(), p.ids.begin(), p.ids.end());
    after = after || p.is_sequence;
  }
  return out;
}

StatusOr<PostProcessor> ParsePostProcessor(const JsonRef& node) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<PostProcessor::Piece> pieces, ParsePieces(node));
  return PostProcessor(std::move(pieces));
}

}  // namespace tessera
