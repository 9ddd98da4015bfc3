#include "common/tokenizer/token_decoder.h"

#include <fmt/format.h>

#include "common/base/utf8.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/text_pattern.h"

namespace tessera {

namespace {

constexpr const char* kSupported =
    "ByteLevel, Metaspace, Sequence, Replace, ByteFallback, Fuse, Strip";

class SequenceDecoder : public TokenDecoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<TokenDecoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }
  std::string TokenBytes(std::string token) const override {
    for (const auto& p : parts_) token = p->TokenBytes(std::move(token));
    return token;
  }
  bool UsesByteFallback() const override {
    for (const auto& p : parts_) {
      if (p->UsesByteFallback()) return true;
    }
    return false;
  }
  bool WindowSafe(bool& fused) const override {
    for (const auto& p : parts_) {
      if (!p->WindowSafe(fused)) return false;
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<TokenDecoder>> parts_;
};

// All tokens become one string: each token's characters are mapped back to
// bytes (a token holding a character outside the byte map contributes its
// UTF-8 bytes unchanged), then the bytes are read as lossy UTF-8.
class ByteLevelDecoder : public TokenDecoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      size_t pos = 0;
      bool mapped = true;
      while (pos < t.size()) {
        const int b = ByteLevelCharToByte(NextCodePoint(t, pos));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens.assign(1, Utf8Lossy(bytes));
  }
  // The mapped bytes, not read as UTF-8 (a token may end inside a character).
  std::string TokenBytes(std::string token) const override {
    std::string bytes;
    size_t pos = 0;
    while (pos < token.size()) {
      const int b = ByteLevelCharToByte(NextCodePoint(token, pos));
      if (b < 0) return token;
      bytes.push_back(static_cast<char>(b));
    }
    return bytes;
  }
  bool WindowSafe(bool& fused) const override {
    fused = true;
    return true;
  }
};

// The replacement character becomes a space, except that in the first token
// (when a prefix was prepended at encode time) it is dropped.
class MetaspaceDecoder : public TokenDecoder {
 public:
  explicit MetaspaceDecoder(MetaspaceOptions options) : options_(std::move(options)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    const std::string& rep = options_.replacement;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool drop = i == 0 && options_.prepend_scheme != PrependScheme::kNever;
      std::string& t = tokens[i];
      if (t.find(rep) == std::string::npos) continue;
      std::string out;
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, rep.size(), rep) == 0) {
          if (!drop) out.push_back(' ');
          pos += rep.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      t = std::move(out);
    }
  }
  bool WindowSafe(bool& fused) const override { return !fused; }
  // Every replacement character is a space (the first token's drop is a start-of-text rule).
  std::string TokenBytes(std::string token) const override {
    const std::string& rep = options_.replacement;
    std::string out;
    for (size_t pos = 0; pos < token.size();) {
      if (!rep.empty() && token.compare(pos, rep.size(), rep) == 0) {
        out.push_back(' ');
        pos += rep.size();
      } else {
        out.push_back(token[pos++]);
      }
    }
    return out;
  }

 private:
  MetaspaceOptions options_;
};

class ReplaceDecoder : public TokenDecoder {
 public:
  ReplaceDecoder(TextPattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = pattern_.ReplaceAll(t, content_);
  }
  bool WindowSafe(bool& fused) const override { return !fused; }

 private:
  TextPattern pattern_;
  std::string content_;
};

// Value of a hex digit, or -1.
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Runs of <0xNN> tokens become the UTF-8 text they encode; an invalid run
// becomes one U+FFFD per byte.
class ByteFallbackDecoder : public TokenDecoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    size_t run_len = 0;
    auto flush = [&]() {
      if (run_len == 0) return;
      if (IsValidUtf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_len; ++i) out.emplace_back(kUtf8Replacement);
      }
      run.clear();
      run_len = 0;
    };
    for (auto& t : tokens) {
      const int b = ByteFallbackValue(t);
      if (b >= 0) {
        run.push_back(static_cast<char>(b));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  bool UsesByteFallback() const override { return true; }
  // <0xNN> is the byte NN alone, valid UTF-8 or not.
  std::string TokenBytes(std::string token) const override {
    const int b = ByteFallbackValue(token);
    return b >= 0 ? std::string(1, static_cast<char>(b)) : token;
  }
};

class FuseDecoder : public TokenDecoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
  bool WindowSafe(bool& fused) const override {
    fused = true;
    return true;
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` (one
// character) from each token.
class StripDecoder : public TokenDecoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    const size_t w = content_.size();
    for (auto& t : tokens) {
      size_t begin = 0;
      for (size_t i = 0; i < start_ && begin + w <= t.size() && t.compare(begin, w, content_) == 0;
           ++i) {
        begin += w;
      }
      size_t end = t.size();
      for (size_t i = 0; i < stop_ && end >= begin + w && t.compare(end - w, w, content_) == 0;
           ++i) {
        end -= w;
      }
      t = t.substr(begin, end - begin);
    }
  }
  // Strip trims the text's ends (a start-of-text rule): a token keeps its bytes.
  std::string TokenBytes(std::string token) const override { return token; }

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

}  // namespace

int ByteFallbackValue(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  const int lo = HexValue(t[4]);
  if (lo < 0) return -1;
  if (t[3] == '+') return lo;
  const int hi = HexValue(t[3]);
  return hi < 0 ? -1 : hi * 16 + lo;
}

std::string TokenDecoder::TokenBytes(std::string token) const {
  std::vector<std::string> one{std::move(token)};
  DecodeChain(one);
  std::string out;
  for (const auto& t : one) out += t;
  return out;
}

std::string TokenDecoder::Decode(std::vector<std::string> tokens) const {
  DecodeChain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

StatusOr<std::unique_ptr<TokenDecoder>> ParseTokenDecoder(const JsonRef& node) {
  if (node.is_null()) return std::unique_ptr<TokenDecoder>();
  TESSERA_RETURN_IF_ERROR(node.ExpectObject());
  TESSERA_ASSIGN_OR_RETURN(std::string type, node.GetString("type"));
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(JsonRef list, node.Required("decoders"));
    TESSERA_RETURN_IF_ERROR(list.ExpectArray());
    std::vector<std::unique_ptr<TokenDecoder>> parts;
    for (size_t i = 0; i < list.node().size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<TokenDecoder> part, ParseTokenDecoder(list.At(i)));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<TokenDecoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<TokenDecoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    TESSERA_ASSIGN_OR_RETURN(MetaspaceOptions options, ParseMetaspaceOptions(node));
    return std::unique_ptr<TokenDecoder>(new MetaspaceDecoder(std::move(options)));
  }
  if (type == "Replace") {
    TESSERA_ASSIGN_OR_RETURN(JsonRef pattern_node, node.Required("pattern"));
    TESSERA_ASSIGN_OR_RETURN(TextPattern pattern, TextPattern::FromJson(pattern_node));
    TESSERA_ASSIGN_OR_RETURN(std::string content, node.GetString("content"));
    return std::unique_ptr<TokenDecoder>(
        new ReplaceDecoder(std::move(pattern), std::move(content)));
  }
  if (type == "ByteFallback") return std::unique_ptr<TokenDecoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<TokenDecoder>(new FuseDecoder());
  if (type == "Strip") {
    TESSERA_ASSIGN_OR_RETURN(std::string content, node.GetString("content"));
    size_t pos = 0;
    if (content.empty() || !IsValidUtf8(content) ||
        (NextCodePoint(content, pos), pos != content.size())) {
      return node.Child("content").Error("expected exactly one character");
    }
    TESSERA_ASSIGN_OR_RETURN(int64_t start, node.GetIntOr("start", 0));
    TESSERA_ASSIGN_OR_RETURN(int64_t stop, node.GetIntOr("stop", 0));
    if (start < 0 || stop < 0) return node.Error("start and stop must be non-negative");
    return std::unique_ptr<TokenDecoder>(new StripDecoder(
        std::move(content), static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  return node.Child("type").Unsupported("decoder type", type, kSupported);
}

}  // namespace tessera
