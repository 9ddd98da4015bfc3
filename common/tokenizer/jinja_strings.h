// Python str semantics for chat templates (ASCII case mapping): the helpers
// jinja_builtins.cc's filters share, and the str methods templates call.
// Internal to the Jinja interpreter.
//
// Errors: kInvalidArgument naming the method and the problem.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/tokenizer/jinja_value.h"

namespace tessera::jinja {

bool IsWs(char c);
std::string Lower(std::string s);
std::string Upper(std::string s);
std::string Capitalize(const std::string& s);  // str.capitalize
std::string Title(const std::string& s);       // str.title
// str.strip/lstrip/rstrip; chars null or None: whitespace.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right);
// str.replace(from, to, count); count < 0: all. Errors: result too large.
StatusOr<std::string> Replace(const std::string& s, const std::string& from, const std::string& to,
                              int64_t count);
// str.split(sep, maxsplit); sep null/None: runs of whitespace.
Value Split(const std::string& s, const Value* sep, int64_t maxsplit);
// Argument `i` by position or `name` by keyword; null when absent.
const Value* Arg(CallArgs& a, size_t i, const char* name);
// An integer argument, `def` when absent or None. Errors: not an integer.
StatusOr<int64_t> IntArg(const Value* v, int64_t def, const char* what);
Status NeedString(const Value& v, const std::string& what);
// s.<name>(args) for the str methods jinja_parser.cc accepts.
StatusOr<Value> StringMethod(const std::string& s, const std::string& name, CallArgs& a);

}  // namespace tessera::jinja
