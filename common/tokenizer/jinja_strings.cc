#include "common/tokenizer/jinja_strings.h"

#include <cctype>

#include "common/tokenizer/jinja_builtins.h"

namespace tessera::jinja {

namespace {

Status Bad(const std::string& what) { return InvalidArgument(what); }

}  // namespace

bool IsWs(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Capitalize(const std::string& s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}
std::string Title(const std::string& s) {
  std::string out;
  bool prev_alpha = false;
  for (char c : s) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    out += static_cast<char>(alpha ? (prev_alpha ? std::tolower(static_cast<unsigned char>(c))
                                                 : std::toupper(static_cast<unsigned char>(c)))
                                   : c);
    prev_alpha = alpha;
  }
  return out;
}

std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip = [&](char c) {
    if (!chars || chars->is_none()) return IsWs(c);
    return chars->str().find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip(s[b])) ++b;
  if (right)
    while (e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

StatusOr<std::string> Replace(const std::string& s, const std::string& from, const std::string& to,
                              int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` around every code point.
    for (auto cp : CodePoints(s)) {
      if (count-- == 0) break;
      out += to;
      out += cp;
    }
    return out + (count != 0 ? to : "");
  }
  size_t pos = 0;
  while (count != 0) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    if (out.size() > kMaxStringBytes) return Bad("replace: result too large");
    pos = at + from.size();
    --count;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Value Split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && IsWs(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit == 0) {
        size_t e = s.size();
        while (e > i && IsWs(s[e - 1])) --e;
        out.push_back(Value::String(s.substr(i, e - i)));
        break;
      }
      size_t e = i;
      while (e < s.size() && !IsWs(s[e])) ++e;
      out.push_back(Value::String(s.substr(i, e - i)));
      --maxsplit;
      i = e;
    }
    return Value::MakeList(std::move(out));
  }
  const std::string& d = sep->str();
  size_t pos = 0;
  while (maxsplit != 0) {
    const size_t at = s.find(d, pos);
    if (at == std::string::npos) break;
    out.push_back(Value::String(s.substr(pos, at - pos)));
    pos = at + d.size();
    --maxsplit;
  }
  out.push_back(Value::String(s.substr(pos)));
  return Value::MakeList(std::move(out));
}

// Argument `i` by position or `name` by keyword; null when absent.
const Value* Arg(CallArgs& a, size_t i, const char* name) {
  for (auto& [k, v] : a.named)
    if (k == name) return &v;
  return i < a.positional.size() ? &a.positional[i] : nullptr;
}

StatusOr<int64_t> IntArg(const Value* v, int64_t def, const char* what) {
  if (!v || v->is_none()) return def;
  if (v->kind() != Value::Kind::kInt && v->kind() != Value::Kind::kBool)
    return Bad(std::string(what) + ": expected an integer, got " + v->TypeName());
  return v->as_int();
}

Status NeedString(const Value& v, const std::string& what) {
  if (!v.is_string()) return Bad(what + ": expected a string, got " + v.TypeName());
  return Status::Ok();
}

StatusOr<Value> StringMethod(const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::String(Strip(s, Arg(a, 0, "chars"), name != "rstrip", name != "lstrip"));
  if (name == "upper") return Value::String(Upper(s));
  if (name == "lower") return Value::String(Lower(s));
  if (name == "title") return Value::String(Title(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "startswith" || name == "endswith") {
    const Value* p = Arg(a, 0, "prefix");
    if (!p) return Bad(name + "() takes at least 1 argument");
    std::vector<std::string> options;
    if (p->is_list()) {
      for (const Value& x : p->list()) {
        TESSERA_RETURN_IF_ERROR(NeedString(x, name));
        options.push_back(x.str());
      }
    } else {
      TESSERA_RETURN_IF_ERROR(NeedString(*p, name));
      options.push_back(p->str());
    }
    for (const std::string& o : options) {
      if (name == "startswith"
              ? s.rfind(o, 0) == 0
              : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0)
        return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "split") {
    const Value* sep = Arg(a, 0, "sep");
    if (sep && !sep->is_none()) {
      TESSERA_RETURN_IF_ERROR(NeedString(*sep, "split"));
      if (sep->str().empty()) return Bad("split: empty separator");
    }
    TESSERA_ASSIGN_OR_RETURN(int64_t max, IntArg(Arg(a, 1, "maxsplit"), -1, "split"));
    return Split(s, sep, max);
  }
  if (name == "rsplit") {
    const Value* sep = Arg(a, 0, "sep");
    TESSERA_ASSIGN_OR_RETURN(int64_t max, IntArg(Arg(a, 1, "maxsplit"), -1, "rsplit"));
    if (max >= 0) return Bad("rsplit: maxsplit is not supported");
    return Split(s, sep, -1);
  }
  if (name == "splitlines") {
    List out;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t e = s.find('\n', pos);
      if (e == std::string::npos) e = s.size();
      std::string line = s.substr(pos, e - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      out.push_back(Value::String(line));
      pos = e + 1;
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "replace") {
    const Value* f = Arg(a, 0, "old");
    const Value* t = Arg(a, 1, "new");
    if (!f || !t || !f->is_string() || !t->is_string())
      return Bad("replace() takes two string arguments");
    TESSERA_ASSIGN_OR_RETURN(int64_t count, IntArg(Arg(a, 2, "count"), -1, "replace"));
    TESSERA_ASSIGN_OR_RETURN(std::string r, Replace(s, f->str(), t->str(), count));
    return Value::String(std::move(r));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    const Value* sub = Arg(a, 0, "sub");
    if (!sub || !sub->is_string()) return Bad(name + "() takes a string argument");
    if (name == "count") {
      if (sub->str().empty()) return Value::Int(static_cast<int64_t>(CodePoints(s).size()) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub->str()); p != std::string::npos;
           p = s.find(sub->str(), p + sub->str().size()))
        ++n;
      return Value::Int(n);
    }
    const size_t at = name == "rfind" ? s.rfind(sub->str()) : s.find(sub->str());
    if (at == std::string::npos) {
      if (name == "index") return Bad("substring not found");
      return Value::Int(-1);
    }
    return Value::Int(static_cast<int64_t>(CodePoints(std::string_view(s).substr(0, at)).size()));
  }
  if (name == "join") {
    const Value* it = Arg(a, 0, "iterable");
    if (!it) return Bad("join() takes 1 argument");
    TESSERA_ASSIGN_OR_RETURN(List items, Iterate(*it));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      TESSERA_RETURN_IF_ERROR(NeedString(items[i], "join"));
      if (i) out += s;
      out += items[i].str();
      if (out.size() > kMaxStringBytes) return Bad("join: result too large");
    }
    return Value::String(std::move(out));
  }
  auto all = [&](auto pred) {
    if (s.empty()) return Value::Bool(false);
    for (char c : s)
      if (!pred(static_cast<unsigned char>(c))) return Value::Bool(false);
    return Value::Bool(true);
  };
  if (name == "isdigit") return all([](unsigned char c) { return std::isdigit(c) != 0; });
  if (name == "isalpha") return all([](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum") return all([](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "isspace") return all([](unsigned char c) { return IsWs(static_cast<char>(c)); });
  if (name == "islower") return Value::Bool(Lower(s) == s && Upper(s) != s);
  if (name == "isupper") return Value::Bool(Upper(s) == s && Lower(s) != s);
  return Bad("'str' object has no method '" + name + "'");
}

}  // namespace tessera::jinja
