#include "common/tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tessera::jinja {

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(FromJson(e));
      return MakeList(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), FromJson(*it));
      return MakeDict(std::move(d));
    }
    default:
      return None();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !str_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    default:
      return true;
  }
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string PythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-1.2345e+02"
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t point = static_cast<size_t>(exp) + 1;
    if (digits.size() <= point) {
      out = digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, point) + "." + digits.substr(point);
    }
  }
  return neg ? "-" + out : out;
}

std::string PythonRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", u);
      out += b;
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

namespace {

StatusOr<std::string> Repr(const Value& v) {
  if (v.is_string()) return PythonRepr(v.str());
  return v.ToPython();
}

void JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    char b[16];
    if (c < 0x20) {
      std::snprintf(b, sizeof b, "\\u%04x", c);
      *out += b;
    } else if (c >= 0x80 && ensure_ascii) {
      const size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      uint32_t cp = c & (n == 2 ? 0x1f : n == 3 ? 0x0f : 0x07);
      for (size_t k = 1; k < n && i + k < s.size(); ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      i += n - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      *out += b;
    } else {
      *out += static_cast<char>(c);
    }
  }
  *out += '"';
}

Status JsonInto(const Value& v, bool ascii, int indent, bool sort, int depth, std::string* out) {
  if (depth > 200) return InvalidArgument("tojson: value nested too deeply");
  auto newline = [&](int d) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      *out += std::to_string(v.as_int());
      return Status::Ok();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : PythonFloat(d);
      return Status::Ok();
    }
    case Value::Kind::kString:
      JsonString(v.str(), ascii, out);
      return Status::Ok();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return Status::Ok();
      }
      *out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        TESSERA_RETURN_IF_ERROR(JsonInto(v.list()[i], ascii, indent, sort, depth + 1, out));
      }
      newline(depth);
      *out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      if (v.dict().items.empty()) {
        *out += "{}";
        return Status::Ok();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict().items) items.push_back(&kv);
      if (sort)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, ascii, out);
        *out += ": ";
        TESSERA_RETURN_IF_ERROR(JsonInto(items[i]->second, ascii, indent, sort, depth + 1, out));
      }
      newline(depth);
      *out += '}';
      return Status::Ok();
    }
    default:
      return InvalidArgument(std::string("Object of type ") + v.TypeName() +
                             " is not JSON serializable");
  }
}

}  // namespace

StatusOr<std::string> Value::ToPython() const {
  switch (kind_) {
    case Kind::kUndefined:
      return std::string();
    case Kind::kNone:
      return std::string("None");
    case Kind::kBool:
      return std::string(int_ ? "True" : "False");
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return PythonFloat(float_);
    case Kind::kString:
      return *str_;
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        TESSERA_ASSIGN_OR_RETURN(std::string s, Repr((*list_)[i]));
        out += s;
      }
      return out + "]";
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = kind_ == Kind::kDict ? "{" : "<Namespace {";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i) out += ", ";
        TESSERA_ASSIGN_OR_RETURN(std::string s, Repr(dict_->items[i].second));
        out += PythonRepr(dict_->items[i].first) + ": " + s;
      }
      return out + (kind_ == Kind::kDict ? "}" : "}>");
    }
    case Kind::kCallable:
      return InvalidArgument("a function or method cannot be rendered (call it)");
  }
  return std::string();
}

StatusOr<std::string> Value::ToJson(bool ensure_ascii, int indent, bool sort_keys) const {
  std::string out;
  TESSERA_RETURN_IF_ERROR(JsonInto(*this, ensure_ascii, indent, sort_keys, 0, &out));
  return out;
}

bool Value::Equals(const Value& o) const {
  if (is_number() || kind_ == Kind::kBool) {
    if (!(o.is_number() || o.kind_ == Kind::kBool)) return false;
    if (kind_ == Kind::kFloat || o.kind_ == Kind::kFloat) return as_double() == o.as_double();
    return int_ == o.int_;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *str_ == *o.str_;
    case Kind::kList: {
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i)
        if (!(*list_)[i].Equals((*o.list_)[i])) return false;
      return true;
    }
    case Kind::kDict: {
      if (dict_->items.size() != o.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        const Value* w = o.dict_->Find(k);
        if (!w || !v.Equals(*w)) return false;
      }
      return true;
    }
    default:
      return dict_ == o.dict_ && fn_ == o.fn_;
  }
}

StatusOr<bool> Value::Less(const Value& a, const Value& b) {
  const bool an = a.is_number() || a.kind_ == Kind::kBool;
  const bool bn = b.is_number() || b.kind_ == Kind::kBool;
  if (an && bn) {
    if (a.kind_ == Kind::kFloat || b.kind_ == Kind::kFloat) return a.as_double() < b.as_double();
    return a.int_ < b.int_;
  }
  if (a.is_string() && b.is_string()) return *a.str_ < *b.str_;
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list_->size(), b.list_->size());
    for (size_t i = 0; i < n; ++i) {
      if ((*a.list_)[i].Equals((*b.list_)[i])) continue;
      return Less((*a.list_)[i], (*b.list_)[i]);
    }
    return a.list_->size() < b.list_->size();
  }
  return InvalidArgument(std::string("'<' not supported between instances of '") + a.TypeName() +
                         "' and '" + b.TypeName() + "'");
}

}  // namespace tessera::jinja
