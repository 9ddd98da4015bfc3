#include "common/tokenizer/text_pattern.h"

#include <fmt/format.h>

namespace tessera {

StatusOr<TextPattern> TextPattern::FromJson(const JsonRef& node) {
  TESSERA_RETURN_IF_ERROR(node.ExpectObject());
  TextPattern pattern;
  if (node.Has("String")) {
    TESSERA_ASSIGN_OR_RETURN(pattern.literal_, node.GetString("String"));
    if (pattern.literal_.empty()) return node.Error("empty String pattern");
    return pattern;
  }
  if (node.Has("Regex")) {
    TESSERA_ASSIGN_OR_RETURN(std::string re, node.GetString("Regex"));
    TESSERA_ASSIGN_OR_RETURN(
        Regex compiled, Regex::Compile(re, fmt::format("{}: {}.Regex", node.file(), node.path())));
    pattern.regex_.emplace(std::move(compiled));
    return pattern;
  }
  return node.Error("expected a pattern object with key 'String' or 'Regex'");
}

std::vector<std::pair<size_t, size_t>> TextPattern::FindAll(std::string_view subject) const {
  if (regex_) return regex_->FindAll(subject);
  std::vector<std::pair<size_t, size_t>> matches;
  for (size_t pos = subject.find(literal_); pos != std::string_view::npos;
       pos = subject.find(literal_, pos + literal_.size())) {
    matches.emplace_back(pos, pos + literal_.size());
  }
  return matches;
}

std::string TextPattern::ReplaceAll(std::string_view subject, std::string_view replacement) const {
  std::string out;
  out.reserve(subject.size());
  size_t prev = 0;
  for (const auto& [b, e] : FindAll(subject)) {
    out.append(subject.substr(prev, b - prev));
    out.append(replacement);
    prev = e;
  }
  out.append(subject.substr(prev));
  return out;
}

}  // namespace tessera
