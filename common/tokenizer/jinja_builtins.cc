#include "common/tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "common/tokenizer/jinja_strings.h"

namespace tessera::jinja {

namespace {

Status Bad(const std::string& what) { return InvalidArgument(what); }

StatusOr<std::string> Str(const Value& v) { return v.ToPython(); }

StatusOr<Value> DictMethod(const Value& d, const std::string& name, CallArgs& a) {
  if (name == "get") {
    const Value* k = Arg(a, 0, "key");
    if (!k) return Bad("get() takes at least 1 argument");
    const Value* def = Arg(a, 1, "default");
    if (k->is_string())
      if (const Value* v = d.dict().Find(k->str())) return *v;
    return def ? *def : Value::None();
  }
  List out;
  for (const auto& [k, v] : d.dict().items) {
    if (name == "keys") out.push_back(Value::String(k));
    if (name == "values") out.push_back(v);
    if (name == "items") out.push_back(Value::MakeList({Value::String(k), v}));
  }
  if (name == "keys" || name == "values" || name == "items") return Value::MakeList(std::move(out));
  return Bad("'dict' object has no method '" + name + "'");
}

bool IsStringMethod(const std::string& n) {
  static const char* kNames[] = {"strip",   "lstrip",     "rstrip",     "upper",    "lower",
                                 "title",   "capitalize", "startswith", "endswith", "split",
                                 "rsplit",  "splitlines", "replace",    "find",     "rfind",
                                 "count",   "index",      "join",       "isdigit",  "isalpha",
                                 "isalnum", "isspace",    "islower",    "isupper"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

bool IsDictMethod(const std::string& n) {
  return n == "get" || n == "items" || n == "keys" || n == "values";
}

StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePoints(v.str()).size());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().items.size());
    default:
      return Bad(std::string("object of type '") + v.TypeName() + "' has no len()");
  }
}

// Sort key / attribute path "a.b" as jinja2's make_attrgetter.
StatusOr<Value> AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part =
        path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    TESSERA_ASSIGN_OR_RETURN(cur, digits ? GetItem(cur, Value::Int(std::stoll(part)))
                                         : GetItem(cur, Value::String(part)));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

StatusOr<Value> SelectOrReject(const std::string& name, const Value& v, CallArgs& a) {
  const bool attr = name == "selectattr" || name == "rejectattr";
  const bool want = name == "select" || name == "selectattr";
  TESSERA_ASSIGN_OR_RETURN(List items, Iterate(v));
  size_t next = 0;
  std::string attr_name;
  if (attr) {
    if (a.positional.empty() || !a.positional[0].is_string())
      return Bad(name + ": expected an attribute name");
    attr_name = a.positional[0].str();
    next = 1;
  }
  std::string test;
  if (next < a.positional.size()) {
    if (!a.positional[next].is_string()) return Bad(name + ": expected a test name");
    test = a.positional[next].str();
  }
  CallArgs targs;
  for (size_t i = next + 1; i < a.positional.size(); ++i)
    targs.positional.push_back(a.positional[i]);
  List out;
  for (const Value& item : items) {
    Value subject = item;
    if (attr) {
      TESSERA_ASSIGN_OR_RETURN(subject, AttrPath(item, attr_name));
    }
    bool r = subject.Truthy();
    if (!test.empty()) {
      CallArgs copy = targs;
      TESSERA_ASSIGN_OR_RETURN(r, ApplyTest(test, subject, copy));
    }
    if (r == want) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

StatusOr<Value> Sorted(List items, CallArgs& a) {
  const Value* rev = Arg(a, 0, "reverse");
  const Value* cs = Arg(a, 1, "case_sensitive");
  const Value* attr = Arg(a, 2, "attribute");
  const bool case_sensitive = cs && cs->Truthy();
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& x : items) {
    Value k = x;
    if (attr && attr->is_string()) {
      TESSERA_ASSIGN_OR_RETURN(k, AttrPath(x, attr->str()));
    }
    if (k.is_string() && !case_sensitive) k = Value::String(Lower(k.str()));
    keyed.emplace_back(k, x);
  }
  Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& l, const auto& r) {
    auto lt = Value::Less(l.first, r.first);
    if (!lt.ok()) {
      err = lt.status();
      return false;
    }
    return *lt;
  });
  if (!err.ok()) return err;
  List out;
  for (auto& kv : keyed) out.push_back(kv.second);
  if (rev && rev->Truthy()) std::reverse(out.begin(), out.end());
  return Value::MakeList(std::move(out));
}

}  // namespace

StatusOr<List> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return List{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      List out;
      for (const auto& kv : v.dict().items) out.push_back(Value::String(kv.first));
      return out;
    }
    case Value::Kind::kString: {
      List out;
      for (auto cp : CodePoints(v.str())) out.push_back(Value::String(std::string(cp)));
      return out;
    }
    default:
      return Bad(std::string("'") + v.TypeName() + "' object is not iterable");
  }
}

StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) {
    return Bad((obj.str().empty() ? std::string("value") : "'" + obj.str() + "'") +
               " is undefined (reading its attribute '" + name + "')");
  }
  const bool str_method = obj.is_string() && IsStringMethod(name);
  const bool dict_method = obj.is_dict() && IsDictMethod(name);
  if (str_method || dict_method) {
    return Value::Function([obj, name, str_method](CallArgs& a) -> StatusOr<Value> {
      return str_method ? StringMethod(obj.str(), name, a) : DictMethod(obj, name, a);
    });
  }
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
  }
  return Value::Undefined(name);
}

StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) {
    return Bad((obj.str().empty() ? std::string("value") : "'" + obj.str() + "'") +
               " is undefined (reading an item)");
  }
  if (obj.is_mapping() && key.is_string()) {
    if (const Value* v = obj.dict().Find(key.str())) return *v;
    return GetAttr(obj, key.str());
  }
  if ((obj.is_list() || obj.is_string()) &&
      (key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool)) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined("list index");
      return obj.list()[static_cast<size_t>(i)];
    }
    const auto cps = CodePoints(obj.str());
    const auto n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined("string index");
    return Value::String(std::string(cps[static_cast<size_t>(i)]));
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  return Value::Undefined("item");
}

StatusOr<Value> Slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  TESSERA_ASSIGN_OR_RETURN(int64_t st, IntArg(step, 1, "slice step"));
  if (st == 0) return Bad("slice step cannot be zero");
  std::vector<Value> items;
  std::vector<std::string_view> cps;
  int64_t n = 0;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else if (obj.is_string()) {
    cps = CodePoints(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else {
    return Bad(std::string("'") + obj.TypeName() + "' object is not subscriptable");
  }
  auto norm = [&](const Value* v, int64_t def) -> StatusOr<int64_t> {
    TESSERA_ASSIGN_OR_RETURN(int64_t x, IntArg(v, def, "slice index"));
    if (!v || v->is_none()) return def;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  TESSERA_ASSIGN_OR_RETURN(int64_t b, norm(start, st > 0 ? 0 : n - 1));
  TESSERA_ASSIGN_OR_RETURN(int64_t e, norm(stop, st > 0 ? n : -1));
  List out;
  std::string s;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_list()) {
      out.push_back(obj.list()[static_cast<size_t>(i)]);
    } else {
      s += cps[static_cast<size_t>(i)];
    }
  }
  return obj.is_list() ? Value::MakeList(std::move(out)) : Value::String(std::move(s));
}

StatusOr<bool> Contains(const Value& c, const Value& x) {
  if (c.is_string()) {
    if (!x.is_string()) return Bad("'in <string>' requires a string as left operand");
    return c.str().find(x.str()) != std::string::npos;
  }
  if (c.is_mapping()) return x.is_string() && c.dict().Find(x.str()) != nullptr;
  TESSERA_ASSIGN_OR_RETURN(List items, Iterate(c));
  for (const Value& v : items)
    if (v.Equals(x)) return true;
  return false;
}

StatusOr<bool> ApplyTest(const std::string& name, const Value& v, CallArgs& a) {
  using K = Value::Kind;
  const Value* arg = a.positional.empty() ? nullptr : &a.positional[0];
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "number") return v.is_number() || v.kind() == K::kBool;
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "callable") return v.kind() == K::kCallable;
  if (name == "lower") return v.is_string() && Lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && Upper(v.str()) == v.str();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != K::kInt) return Bad("test '" + name + "' needs an integer");
    if (name == "divisibleby") {
      if (!arg || arg->kind() != K::kInt || arg->as_int() == 0)
        return Bad("divisibleby needs a non-zero integer");
      return v.as_int() % arg->as_int() == 0;
    }
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (!arg) return Bad("test '" + name + "' needs an argument");
  if (name == "eq" || name == "equalto" || name == "sameas") return v.Equals(*arg);
  if (name == "ne") return !v.Equals(*arg);
  if (name == "in") return Contains(*arg, v);
  if (name == "lt") return Value::Less(v, *arg);
  if (name == "gt") return Value::Less(*arg, v);
  if (name == "le") {
    TESSERA_ASSIGN_OR_RETURN(bool gt, Value::Less(*arg, v));
    return !gt;
  }
  if (name == "ge") {
    TESSERA_ASSIGN_OR_RETURN(bool lt, Value::Less(v, *arg));
    return !lt;
  }
  return Bad("unknown test '" + name + "'");
}

StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs& a) {
  using K = Value::Kind;
  auto str_of = [&]() { return Str(v); };
  if (name == "default" || name == "d") {
    const Value* def = Arg(a, 0, "default_value");
    const Value* boolean = Arg(a, 1, "boolean");
    const bool use = v.is_undefined() || (boolean && boolean->Truthy() && !v.Truthy());
    return use ? (def ? *def : Value::String("")) : v;
  }
  if (name == "safe") return v;
  if (name == "tojson") {
    const Value* ascii = Arg(a, 0, "ensure_ascii");
    const Value* indent = Arg(a, 1, "indent");
    const Value* seps = Arg(a, 2, "separators");
    const Value* sort = Arg(a, 3, "sort_keys");
    if (seps && !seps->is_none()) return Bad("tojson: separators are not supported");
    int ind = -1;
    if (indent && !indent->is_none()) {
      if (indent->kind() != K::kInt || indent->as_int() < 0 || indent->as_int() > 64)
        return Bad("tojson: indent must be an integer 0..64");
      ind = static_cast<int>(indent->as_int());
    }
    TESSERA_ASSIGN_OR_RETURN(std::string j,
                             v.ToJson(ascii && ascii->Truthy(), ind, sort && sort->Truthy()));
    return Value::String(std::move(j));
  }
  if (name == "length" || name == "count") {
    TESSERA_ASSIGN_OR_RETURN(int64_t n, Length(v));
    return Value::Int(n);
  }
  if (name == "list") {
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    return Value::MakeList(std::move(l));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeList();
    if (!v.is_mapping()) return Bad("items: expected a mapping, got " + std::string(v.TypeName()));
    CallArgs none;
    return DictMethod(Value::MakeDict(v.dict()), "items", none);
  }
  if (name == "dictsort") {
    if (!v.is_mapping()) return Bad("dictsort: expected a mapping");
    CallArgs none;
    TESSERA_ASSIGN_OR_RETURN(Value items, DictMethod(Value::MakeDict(v.dict()), "items", none));
    List l = items.list();
    std::stable_sort(l.begin(), l.end(), [](const Value& x, const Value& y) {
      return Lower(x.list()[0].str()) < Lower(y.list()[0].str());
    });
    return Value::MakeList(std::move(l));
  }
  if (name == "first" || name == "last") {
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    if (l.empty()) return Value::Undefined(name);
    return name == "first" ? l.front() : l.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cps = CodePoints(v.str());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::String(out);
    }
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    std::reverse(l.begin(), l.end());
    return Value::MakeList(std::move(l));
  }
  if (name == "sort") {
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    return Sorted(std::move(l), a);
  }
  if (name == "unique") {
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    List out;
    for (const Value& x : l) {
      bool seen = false;
      for (const Value& y : out) seen = seen || y.Equals(x);
      if (!seen) out.push_back(x);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "min" || name == "max" || name == "sum") {
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    if (name == "sum") {
      int64_t isum = 0;
      double fsum = 0;
      bool is_float = false;
      for (const Value& x : l) {
        if (!x.is_number() && x.kind() != K::kBool) return Bad("sum: items must be numbers");
        if (x.kind() == K::kFloat) is_float = true;
        isum += x.kind() == K::kFloat ? 0 : x.as_int();
        fsum += x.as_double();
      }
      return is_float ? Value::Float(fsum) : Value::Int(isum);
    }
    if (l.empty()) return Value::Undefined(name);
    Value best = l[0];
    for (const Value& x : l) {
      TESSERA_ASSIGN_OR_RETURN(bool lt,
                               name == "min" ? Value::Less(x, best) : Value::Less(best, x));
      if (lt) best = x;
    }
    return best;
  }
  if (name == "join") {
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    const Value* sep = Arg(a, 0, "d");
    const Value* attr = Arg(a, 1, "attribute");
    std::string out;
    for (size_t i = 0; i < l.size(); ++i) {
      if (i && sep) {
        TESSERA_ASSIGN_OR_RETURN(std::string s, Str(*sep));
        out += s;
      }
      Value x = l[i];
      if (attr && attr->is_string()) {
        TESSERA_ASSIGN_OR_RETURN(x, AttrPath(x, attr->str()));
      }
      TESSERA_ASSIGN_OR_RETURN(std::string s, Str(x));
      out += s;
      if (out.size() > kMaxStringBytes) return Bad("join: result too large");
    }
    return Value::String(std::move(out));
  }
  if (name == "map") {
    TESSERA_ASSIGN_OR_RETURN(List l, Iterate(v));
    const Value* attr = Arg(a, 99, "attribute");
    List out;
    if (attr) {
      const Value* def = Arg(a, 99, "default");
      for (const Value& x : l) {
        TESSERA_ASSIGN_OR_RETURN(Value y, AttrPath(x, attr->is_string() ? attr->str() : ""));
        out.push_back(y.is_undefined() && def ? *def : y);
      }
      return Value::MakeList(std::move(out));
    }
    if (a.positional.empty() || !a.positional[0].is_string())
      return Bad("map: expected a filter name or attribute=");
    const std::string f = a.positional[0].str();
    if (f == "map") return Bad("map: nested map is not supported");
    CallArgs rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.named = a.named;
    for (const Value& x : l) {
      CallArgs copy = rest;
      TESSERA_ASSIGN_OR_RETURN(Value y, ApplyFilter(f, x, copy));
      out.push_back(y);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return SelectOrReject(name, v, a);
  if (name == "attr") {
    if (a.positional.empty() || !a.positional[0].is_string()) return Bad("attr: expected a name");
    return GetAttr(v, a.positional[0].str());
  }
  if (name == "int") {
    const Value* def = Arg(a, 0, "default");
    const Value d = def ? *def : Value::Int(0);
    if (v.kind() == K::kInt || v.kind() == K::kBool) return Value::Int(v.as_int());
    if (v.kind() == K::kFloat)
      return std::isfinite(v.as_double()) ? Value::Int(static_cast<int64_t>(v.as_double())) : d;
    if (v.is_string()) {
      try {
        size_t used = 0;
        const std::string s = Strip(v.str(), nullptr, true, true);
        const long long x = std::stoll(s, &used);
        if (used == s.size()) return Value::Int(x);
        const double f = std::stod(s, &used);
        if (used == s.size()) return Value::Int(static_cast<int64_t>(f));
      } catch (...) {
      }
    }
    return d;
  }
  if (name == "float") {
    if (v.is_number() || v.kind() == K::kBool) return Value::Float(v.as_double());
    if (v.is_string()) {
      try {
        return Value::Float(std::stod(v.str()));
      } catch (...) {
      }
    }
    const Value* def = Arg(a, 0, "default");
    return def ? *def : Value::Float(0);
  }
  if (name == "abs") {
    if (v.kind() == K::kInt) return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.kind() == K::kFloat) return Value::Float(std::fabs(v.as_double()));
    return Bad("abs: expected a number");
  }
  // String filters: the value as str().
  TESSERA_ASSIGN_OR_RETURN(std::string s, str_of());
  if (name == "string") return Value::String(s);
  if (name == "trim") return Value::String(Strip(s, Arg(a, 0, "chars"), true, true));
  if (name == "upper") return Value::String(Upper(s));
  if (name == "lower") return Value::String(Lower(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "title") return Value::String(Title(s));
  if (name == "wordcount") {
    CallArgs none;
    return Value::Int(static_cast<int64_t>(Split(s, nullptr, -1).list().size()));
  }
  if (name == "replace") {
    const Value* f = Arg(a, 0, "old");
    const Value* t = Arg(a, 1, "new");
    if (!f || !t) return Bad("replace: expected two arguments");
    TESSERA_ASSIGN_OR_RETURN(std::string fs, Str(*f));
    TESSERA_ASSIGN_OR_RETURN(std::string ts, Str(*t));
    TESSERA_ASSIGN_OR_RETURN(int64_t count, IntArg(Arg(a, 2, "count"), -1, "replace"));
    TESSERA_ASSIGN_OR_RETURN(std::string r, Replace(s, fs, ts, count));
    return Value::String(std::move(r));
  }
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    return Value::String(out);
  }
  if (name == "indent") {
    const Value* w = Arg(a, 0, "width");
    const Value* first = Arg(a, 1, "first");
    const Value* blank = Arg(a, 2, "blank");
    std::string pad;
    if (w && w->is_string()) {
      pad = w->str();
    } else {
      TESSERA_ASSIGN_OR_RETURN(int64_t n, IntArg(w, 4, "indent"));
      if (n < 0 || n > 256) return Bad("indent: width out of range");
      pad.assign(static_cast<size_t>(n), ' ');
    }
    std::string out;
    size_t pos = 0;
    bool first_line = true;
    while (pos <= s.size()) {
      size_t e = s.find('\n', pos);
      const bool last = e == std::string::npos;
      if (last) e = s.size();
      const std::string line = s.substr(pos, e - pos);
      const bool do_pad =
          first_line ? (first && first->Truthy()) : (!line.empty() || (blank && blank->Truthy()));
      if (do_pad) out += pad;
      out += line;
      if (last) break;
      out += '\n';
      pos = e + 1;
      first_line = false;
      if (out.size() > kMaxStringBytes) return Bad("indent: result too large");
    }
    return Value::String(out);
  }
  return Bad("unknown filter '" + name + "'");
}

}  // namespace tessera::jinja
