// jinja2's filters, tests and attribute lookup, and the Python methods chat
// templates call on strings and dicts, over jinja::Value. The names accepted
// are those jinja_parser.cc lets through; each behaves as in jinja2 3.1 /
// CPython for the values a chat template sees (ASCII case mapping only).
//
// Errors: kInvalidArgument naming the filter/method and the problem (wrong
// type, wrong arguments, a result over kMaxStringBytes).
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/tokenizer/jinja_value.h"

namespace tessera::jinja {

// Upper bounds of any string (bytes) and list (items) a template builds, and
// of range() (jinja2's sandbox MAX_RANGE).
inline constexpr size_t kMaxStringBytes = size_t{16} << 20;
inline constexpr size_t kMaxListItems = size_t{1} << 20;
inline constexpr int64_t kMaxRange = 100000;

// obj.name as jinja2's getattr: a Python method of obj (bound), else obj[name];
// undefined when there is none. Errors: obj is undefined.
StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
// obj[key] as jinja2's getitem: item first, then (string key) attribute.
StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step]; null bounds are Python's None.
StatusOr<Value> Slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs& args);
StatusOr<bool> ApplyTest(const std::string& name, const Value& v, CallArgs& args);
// `x in container` (substring, list element, dict key).
StatusOr<bool> Contains(const Value& container, const Value& x);
// Items of an iterable: list items, dict keys, string code points; undefined
// iterates as empty. Errors: not iterable.
StatusOr<List> Iterate(const Value& v);

}  // namespace tessera::jinja
