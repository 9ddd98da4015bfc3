#include "common/tokenizer/pre_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "common/base/regex.h"
#include "common/base/utf8.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/text_pattern.h"

namespace tessera {

namespace {

constexpr const char* kSupported = "Sequence, Split, ByteLevel, Digits, Metaspace";
constexpr const char* kSupportedBehaviors =
    "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous";

// The regex of GPT-2's encoder.py, used by ByteLevel when use_regex is set.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

// Turns the matches inside a piece of `size` bytes into spans covering it,
// applies `invert` and `behavior` (as the `tokenizers` library's
// NormalizedString::split does) and returns the spans to keep.
std::vector<Span> ApplyBehavior(const std::vector<std::pair<size_t, size_t>>& matches, size_t size,
                                SplitBehavior behavior, bool invert) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  }
  if (prev != size) spans.push_back({prev, size, false});
  if (invert) {
    for (auto& s : spans) s.is_match = !s.is_match;
  }

  std::vector<Span> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.is_match) out.push_back(s);
      }
      break;
    case SplitBehavior::kIsolated:
      out = std::move(spans);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool next_match = false;  // whether the span after this one (in order) is a match
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !next_match && !out.empty()) {
          out.back().begin = s.begin;
        } else {
          out.push_back(s);
        }
        next_match = s.is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  return out;
}

// Splits every piece with `find` (returning match ranges) and `behavior`.
template <typename FindFn>
void SplitPieces(std::vector<PreToken>& pieces, const FindFn& find, SplitBehavior behavior,
                 bool invert) {
  std::vector<PreToken> out;
  out.reserve(pieces.size());
  for (auto& piece : pieces) {
    const auto spans = ApplyBehavior(find(piece.text), piece.text.size(), behavior, invert);
    for (const auto& s : spans) {
      if (s.end == s.begin) continue;
      out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.orig_start + s.begin});
    }
  }
  pieces = std::move(out);
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(TextPattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>& pieces) const override {
    SplitPieces(
        pieces, [this](const std::string& s) { return pattern_.FindAll(s); }, behavior_, invert_);
  }

 private:
  TextPattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
      }
    }
    if (regex_) {
      SplitPieces(
          pieces, [this](const std::string& s) { return regex_->FindAll(s); },
          SplitBehavior::kIsolated, false);
    }
    for (auto& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      ByteLevelEncode(p.text, mapped);
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;  // the GPT-2 pattern when use_regex
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  DigitsPreTokenizer(Regex regex) : regex_(std::move(regex)) {}
  void PreTokenize(std::vector<PreToken>& pieces) const override {
    SplitPieces(
        pieces, [this](const std::string& s) { return regex_.FindAll(s); },
        SplitBehavior::kIsolated, false);
  }

 private:
  Regex regex_;  // \p{N} (individual digits) or \p{N}+ (runs)
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void PreTokenize(std::vector<PreToken>& pieces) const override {
    for (auto& p : pieces) {
      std::string text;
      text.reserve(p.text.size() + replacement_.size());
      for (char c : p.text) {
        if (c == ' ') {
          text.append(replacement_);
        } else {
          text.push_back(c);
        }
      }
      const bool starts_with_rep = text.compare(0, replacement_.size(), replacement_) == 0;
      const bool prepend =
          !starts_with_rep && (scheme_ == PrependScheme::kAlways ||
                               (scheme_ == PrependScheme::kFirst && p.orig_start == 0));
      if (prepend) text.insert(0, replacement_);
      p.text = std::move(text);
    }
    if (split_) {
      SplitPieces(
          pieces,
          [this](const std::string& s) {
            std::vector<std::pair<size_t, size_t>> m;
            for (size_t pos = s.find(replacement_); pos != std::string::npos;
                 pos = s.find(replacement_, pos + replacement_.size())) {
              m.emplace_back(pos, pos + replacement_.size());
            }
            return m;
          },
          SplitBehavior::kMergedWithNext, false);
    }
  }

 private:
  std::string replacement_;  // one character, UTF-8
  PrependScheme scheme_;
  bool split_;
};

StatusOr<SplitBehavior> ParseBehavior(const JsonRef& node) {
  TESSERA_ASSIGN_OR_RETURN(std::string s, node.AsString());
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return node.Unsupported("split behavior", s, kSupportedBehaviors);
}

}  // namespace

StatusOr<MetaspaceOptions> ParseMetaspaceOptions(const JsonRef& node) {
  MetaspaceOptions options;
  TESSERA_ASSIGN_OR_RETURN(options.replacement, node.GetString("replacement"));
  const std::string& rep = options.replacement;
  size_t pos = 0;
  if (rep.empty() || !IsValidUtf8(rep) || (NextCodePoint(rep, pos), pos != rep.size())) {
    return node.Child("replacement").Error("expected exactly one character");
  }
  if (node.Has("prepend_scheme")) {
    const JsonRef s = node.Child("prepend_scheme");
    TESSERA_ASSIGN_OR_RETURN(std::string v, s.AsString());
    if (v == "always") {
      options.prepend_scheme = PrependScheme::kAlways;
    } else if (v == "first") {
      options.prepend_scheme = PrependScheme::kFirst;
    } else if (v == "never") {
      options.prepend_scheme = PrependScheme::kNever;
    } else {
      return s.Unsupported("prepend_scheme", v, "always, first, never");
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, node.GetBoolOr("add_prefix_space", true));
    options.prepend_scheme = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  return options;
}

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const JsonRef& node) {
  if (node.is_null()) return std::unique_ptr<PreTokenizer>();
  TESSERA_RETURN_IF_ERROR(node.ExpectObject());
  TESSERA_ASSIGN_OR_RETURN(std::string type, node.GetString("type"));
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(JsonRef list, node.Required("pretokenizers"));
    TESSERA_RETURN_IF_ERROR(list.ExpectArray());
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.node().size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> part, ParsePreTokenizer(list.At(i)));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Split") {
    TESSERA_ASSIGN_OR_RETURN(JsonRef pattern_node, node.Required("pattern"));
    TESSERA_ASSIGN_OR_RETURN(TextPattern pattern, TextPattern::FromJson(pattern_node));
    TESSERA_ASSIGN_OR_RETURN(JsonRef behavior_node, node.Required("behavior"));
    TESSERA_ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(behavior_node));
    TESSERA_ASSIGN_OR_RETURN(bool invert, node.GetBoolOr("invert", false));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "ByteLevel") {
    TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, node.GetBoolOr("add_prefix_space", true));
    TESSERA_ASSIGN_OR_RETURN(bool use_regex, node.GetBoolOr("use_regex", true));
    std::optional<Regex> regex;
    if (use_regex) {
      TESSERA_ASSIGN_OR_RETURN(Regex r, Regex::Compile(kGpt2Pattern, "GPT-2 ByteLevel pattern"));
      regex.emplace(std::move(r));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
  }
  if (type == "Digits") {
    TESSERA_ASSIGN_OR_RETURN(bool individual, node.GetBoolOr("individual_digits", false));
    TESSERA_ASSIGN_OR_RETURN(
        Regex r, Regex::Compile(individual ? R"(\p{N})" : R"(\p{N}+)", "Digits pattern"));
    return std::unique_ptr<PreTokenizer>(new DigitsPreTokenizer(std::move(r)));
  }
  if (type == "Metaspace") {
    TESSERA_ASSIGN_OR_RETURN(MetaspaceOptions options, ParseMetaspaceOptions(node));
    TESSERA_ASSIGN_OR_RETURN(bool split, node.GetBoolOr("split", true));
    return std::unique_ptr<PreTokenizer>(
        new MetaspacePreTokenizer(std::move(options.replacement), options.prepend_scheme, split));
  }
  return node.Child("type").Unsupported("pre_tokenizer type", type, kSupported);
}

}  // namespace tessera
