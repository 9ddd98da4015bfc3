#include "common/base/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include "common/base/utf8.h"

namespace tessera {

// Wraps pcre2_code so that the public header need not include pcre2.h.
struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
};

void Regex::CodeDeleter::operator()(Code* code) const {
  if (code == nullptr) return;
  pcre2_code_free(code->code);
  delete code;
}

StatusOr<Regex> Regex::Compile(std::string_view pattern, const std::string& where) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_code, buffer, sizeof(buffer));
    return InvalidArgument(fmt::format("{}: cannot compile regex /{}/ at offset {}: {}", where,
                                       pattern, error_offset,
                                       reinterpret_cast<const char*>(buffer)));
  }
  Regex regex;
  regex.pattern_ = std::string(pattern);
  regex.code_.reset(new Code{code, pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0});
  return regex;
}

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  TESSERA_CHECK(md != nullptr);
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    // The subject was validated once by the caller; skip PCRE2's UTF check.
    int rc = pcre2_match(code_->code, data, subject.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Very long runs can exhaust the JIT stack; the interpreter has no such limit.
      rc = pcre2_match(code_->code, data, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md, nullptr);
    }
    // NOMATCH ends the scan; any other failure (a match or depth limit on a
    // pathological pattern) leaves the rest of the subject unmatched.
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0];
    const size_t e = ov[1];
    matches.emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {
      if (e >= subject.size()) break;
      start = e + Utf8LeadLength(static_cast<unsigned char>(subject[e]));
    }
  }
  pcre2_match_data_free(md);
  return matches;
}

}  // namespace tessera
