// LlguidanceLibrary: LLGuidance's C API (the grammar engine of structured
// outputs), loaded at run time from the shared library of the PyPI wheel
// `llguidance` as packaged (scripts/setup unpacks llguidance/_lib.abi3.so
// into the cache; CMakeLists.txt pins the version).
//
// Only the few functions Tessera calls are declared here, from LLGuidance's
// documented C API (parser/llguidance.h of guidance-ai/llguidance; the
// struct layouts below follow it field for field). The wheel's library is a
// CPython extension module linked with BIND_NOW: its Python symbols must
// resolve when it is loaded although the llg_* functions never call them, so
// Load first loads libpython (RTLD_GLOBAL, no interpreter is started).
//
// Thread-safety: a loaded library is immutable; the functions are
// LLGuidance's (a tokenizer may be shared; one matcher per thread at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status.h"

namespace tessera {

// Opaque LLGuidance handles.
struct LlgTokenizer;
struct LlgMatcher;

// LlgParserLimits: 0 = LLGuidance's default for every field.
struct LlgParserLimits {
  size_t max_items_in_row;
  uint64_t initial_lexer_fuel;
  uint64_t step_lexer_fuel;
  size_t step_max_items;
  size_t max_lexer_states;
  size_t max_grammar_size;
  bool precompute_large_lexemes;
  bool verbose_errors;
};

// LlgConstraintInit: zero it, then llg_constraint_init_set_defaults.
struct LlgConstraintInit {
  const LlgTokenizer* tokenizer;
  uint32_t log_buffer_level;
  uint32_t log_stderr_level;
  bool ff_tokens_ok;
  bool backtrack_ok;
  LlgParserLimits limits;
};

// Tokenizes bytes[0, bytes_len) into at most output_tokens_len ids; returns
// the full count. Must be thread-safe.
using LlgTokenizeFn = size_t (*)(const void* user_data, const uint8_t* bytes, size_t bytes_len,
                                 uint32_t* output_tokens, size_t output_tokens_len);

// LlgTokenizerInit (the v1 struct): zero it before setting fields.
struct LlgTokenizerInit {
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t* token_lens;  // [vocab_size]
  const uint8_t* token_bytes;  // sum(token_lens) bytes
  const char* tokenizer_json;  // null: token_lens/token_bytes are used
  bool tokenize_assumes_string;
  LlgTokenizeFn tokenize_fn;
  bool use_approximate_greedy_tokenize_fn;
  const void* tokenize_user_data;
  const char* const* slices;  // null = LLGuidance's default slices
};

class LlguidanceLibrary {
 public:
  // Loads `python_library` (e.g. "libpython3.11.so.1.0", a name the dynamic
  // loader resolves or a path) globally, then `llguidance_library` (a path),
  // and resolves the functions below. Errors: kNotFound naming the file that
  // is missing and how to get it (scripts/setup), kFailedPrecondition with
  // dlerror() for a library that does not load or lacks a function.
  static StatusOr<std::shared_ptr<const LlguidanceLibrary>> Load(
      const std::string& llguidance_library, const std::string& python_library);

  ~LlguidanceLibrary();
  LlguidanceLibrary(const LlguidanceLibrary&) = delete;
  LlguidanceLibrary& operator=(const LlguidanceLibrary&) = delete;

  const std::string& path() const { return path_; }

  // The C API (names as in llguidance.h, without the llg_ prefix).
  LlgTokenizer* (*new_tokenizer)(const LlgTokenizerInit*, char* error, size_t error_len) = nullptr;
  void (*free_tokenizer)(LlgTokenizer*) = nullptr;
  void (*constraint_init_set_defaults)(LlgConstraintInit*, const LlgTokenizer*) = nullptr;
  // constraint_type: "json_schema", "json_object", "regex", "lark", "llguidance".
  LlgMatcher* (*new_matcher)(const LlgConstraintInit*, const char* constraint_type,
                             const char* data) = nullptr;
  const char* (*matcher_get_error)(LlgMatcher*) = nullptr;
  size_t (*matcher_get_mask_byte_size)(const LlgMatcher*) = nullptr;
  int32_t (*matcher_compute_mask_into)(LlgMatcher*, uint32_t* mask, size_t mask_bytes) = nullptr;
  int32_t (*matcher_consume_token)(LlgMatcher*, uint32_t token) = nullptr;
  void (*free_matcher)(LlgMatcher*) = nullptr;

 private:
  LlguidanceLibrary() = default;
  std::string path_;
  void* python_ = nullptr;
  void* handle_ = nullptr;
};

}  // namespace tessera
