// Splits a chat template into tokens the way jinja2's lexer does with the
// settings transformers uses (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False):
//  - text between tags; {{ ... }} (kVarBegin..kVarEnd), {% ... %}
//    (kBlockBegin..kBlockEnd), comments {# ... #} dropped;
//  - "-" after an opening / before a closing delimiter strips all whitespace
//    on that side; "+" after "{%" keeps the indentation lstrip_blocks would
//    remove, "+%}" keeps the newline trim_blocks would remove;
//  - lstrip_blocks: spaces/tabs before a {% or {# at the start of a line go;
//  - trim_blocks: the first newline after %} or #} goes;
//  - one trailing newline of the template goes.
// Inside tags: names, integers, floats, strings (Python escapes undone),
// operators. Every token carries its 1-based line.
//
// Thread-safety: pure function.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tessera::jinja {

enum class TokenType {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  TokenType type;
  std::string text;  // text, name, decoded string, number literal or operator
  int line = 1;
};

// Errors: kInvalidArgument "chat_template line N: ..." for an unclosed tag,
// comment or string, or a character that starts no token.
StatusOr<std::vector<Token>> Lex(std::string_view source);

}  // namespace tessera::jinja
