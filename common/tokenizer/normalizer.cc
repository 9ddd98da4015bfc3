#include "common/tokenizer/normalizer.h"

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <vector>

#include "common/tokenizer/text_pattern.h"

namespace tessera {

namespace {

constexpr const char* kSupported = "Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD";

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(std::string& text) const override {
    for (const auto& p : parts_) p->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// Prepend: puts `prepend` in front of non-empty text.
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void Normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

// Replace: every non-overlapping occurrence of the pattern (a literal string
// or a regex), left to right, becomes `content`.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(TextPattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string& text) const override { text = pattern_.ReplaceAll(text, content_); }

 private:
  TextPattern pattern_;
  std::string content_;
};

// Unicode normalization forms through ICU.
class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* impl) : impl_(impl) {}
  void Normalize(std::string& text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString in = icu::UnicodeString::fromUTF8(text);
    if (impl_->isNormalized(in, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    const icu::UnicodeString out = impl_->normalize(in, status);
    if (U_FAILURE(status)) return;  // only on allocation failure; keep the text
    text.clear();
    out.toUTF8String(text);
  }

 private:
  const icu::Normalizer2* impl_;  // owned by ICU, lives for the process
};

StatusOr<std::unique_ptr<Normalizer>> MakeUnicode(const JsonRef& node, const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* impl = nullptr;
  if (type == "NFC") impl = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") impl = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") impl = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") impl = icu::Normalizer2::getNFKDInstance(status);
  if (impl == nullptr || U_FAILURE(status)) {
    return Internal(fmt::format("{}: {}: ICU cannot provide the {} normalizer: {}", node.file(),
                                node.path(), type, u_errorName(status)));
  }
  return std::unique_ptr<Normalizer>(new UnicodeNormalizer(impl));
}

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const JsonRef& node) {
  if (node.is_null()) return std::unique_ptr<Normalizer>();
  TESSERA_RETURN_IF_ERROR(node.ExpectObject());
  TESSERA_ASSIGN_OR_RETURN(std::string type, node.GetString("type"));
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(JsonRef list, node.Required("normalizers"));
    TESSERA_RETURN_IF_ERROR(list.ExpectArray());
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.node().size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> part, ParseNormalizer(list.At(i)));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "Prepend") {
    TESSERA_ASSIGN_OR_RETURN(std::string prepend, node.GetString("prepend"));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prepend)));
  }
  if (type == "Replace") {
    TESSERA_ASSIGN_OR_RETURN(JsonRef pattern_node, node.Required("pattern"));
    TESSERA_ASSIGN_OR_RETURN(TextPattern pattern, TextPattern::FromJson(pattern_node));
    TESSERA_ASSIGN_OR_RETURN(std::string content, node.GetString("content"));
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return MakeUnicode(node, type);
  }
  return node.Child("type").Unsupported("normalizer type", type, kSupported);
}

}  // namespace tessera
