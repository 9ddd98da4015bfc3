// The values a chat template computes with: the JSON-like data of Python's
// jinja2 (undefined, none, bool, int, float, str, list, dict) plus a jinja2
// namespace() and callables (macros, bound methods, globals).
//  - Strings are UTF-8; length/index/slice count code points, as Python does.
//  - Dicts keep insertion order (Python dicts do); keys are strings.
//  - Undefined renders as "", is falsy and iterates as empty, like jinja2's
//    default Undefined; arithmetic on it is an error.
//  - ToJson matches Python's json.dumps (what transformers' tojson calls);
//    ToPython matches str()/repr().
//
// Thread-safety: a Value is not synchronised; lists, dicts and namespaces are
// shared by reference between copies, so one render uses its values alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace tessera::jinja {

class Value;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);
};
// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};
using Callable = std::function<StatusOr<Value>(CallArgs&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value Undefined(std::string what = "") {
    Value v;
    v.str_ = std::make_shared<const std::string>(std::move(what));
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b ? 1 : 0;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double d) {
    Value v(Kind::kFloat);
    v.float_ = d;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.str_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  static Value MakeList(List items = {}) {
    Value v(Kind::kList);
    v.list_ = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value MakeDict(Dict d = {}) {
    Value v(Kind::kDict);
    v.dict_ = std::make_shared<Dict>(std::move(d));
    return v;
  }
  static Value MakeNamespace(Dict d = {}) {
    Value v = MakeDict(std::move(d));
    v.kind_ = Kind::kNamespace;
    return v;
  }
  static Value Function(Callable f) {
    Value v(Kind::kCallable);
    v.fn_ = std::make_shared<Callable>(std::move(f));
    return v;
  }
  // Ordered JSON (object key order kept) to a Value.
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }  // namespace excluded
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_double() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return *str_; }  // kString, or the undefined's name
  List& list() const { return *list_; }
  Dict& dict() const { return *dict_; }  // kDict and kNamespace
  const Callable& fn() const { return *fn_; }

  bool Truthy() const;
  // str(x) as jinja2 renders {{ x }}: "" for undefined, "None", "True",
  // Python reprs of containers. Errors: a callable cannot be rendered.
  StatusOr<std::string> ToPython() const;
  // json.dumps(x, ensure_ascii, indent, separators default, sort_keys).
  // indent < 0: no newlines. Errors: undefined, namespace, callable.
  StatusOr<std::string> ToJson(bool ensure_ascii, int indent, bool sort_keys) const;
  // Python ==, where 1 == 1.0 == True.
  bool Equals(const Value& o) const;
  // Python <: numbers with numbers, strings with strings, lists
  // lexicographically. Errors: other types ("'<' not supported between ...").
  static StatusOr<bool> Less(const Value& a, const Value& b);
  // Python's type name for errors: "str", "int", "dict", "undefined", ...
  const char* TypeName() const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// UTF-8 helpers: the code points of `s`, and back.
std::vector<std::string_view> CodePoints(std::string_view s);
// Python repr of a float ("1.0", "0.1", "1e-05", "inf").
std::string PythonFloat(double d);
// Python repr of a str ('it''s' -> "it's").
std::string PythonRepr(std::string_view s);

}  // namespace tessera::jinja
