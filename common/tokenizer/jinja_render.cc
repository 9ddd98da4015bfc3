#include "common/tokenizer/jinja_render.h"

#include <cmath>
#include <cstdint>
#include <ctime>
#include <limits>
#include <map>

#include "common/tokenizer/jinja_builtins.h"

namespace tessera::jinja {

namespace {

Status LineError(int line, const std::string& what) {
  return InvalidArgument("chat_template line " + std::to_string(line) + ": " + what);
}

// Adds the line to an error from below unless it already names one.
Status AtLine(const Status& s, int line) {
  if (s.message().rfind("chat_template line ", 0) == 0) return s;
  return LineError(line, s.message());
}

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Dict& context, const RenderLimits& limits) : limits_(limits) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context.items) scopes_.back()[k] = v;
    InstallGlobals();
  }

  Status Run(const Body& body, std::string* out) {
    Flow f = Flow::kNormal;
    return Exec(body, out, &f);
  }

 private:
  using Scope = std::map<std::string, Value, std::less<>>;

  void InstallGlobals() {
    Scope& g = scopes_.front();
    g.try_emplace("raise_exception", Value::Function([](CallArgs& a) -> StatusOr<Value> {
                    std::string msg;
                    if (!a.positional.empty()) {
                      TESSERA_ASSIGN_OR_RETURN(msg, a.positional[0].ToPython());
                    }
                    return InvalidArgument("raise_exception: " + msg);
                  }));
    g.try_emplace("strftime_now", Value::Function([](CallArgs& a) -> StatusOr<Value> {
                    if (a.positional.empty() || !a.positional[0].is_string())
                      return InvalidArgument("strftime_now: expected a format string");
                    const std::time_t now = std::time(nullptr);
                    std::tm tm{};
                    localtime_r(&now, &tm);
                    char buf[256];
                    const size_t n =
                        std::strftime(buf, sizeof buf, a.positional[0].str().c_str(), &tm);
                    return Value::String(std::string(buf, n));
                  }));
    auto make_dict = [](bool ns) {
      return Value::Function([ns](CallArgs& a) -> StatusOr<Value> {
        Dict d;
        if (!a.positional.empty()) {
          if (!a.positional[0].is_mapping() || a.positional.size() > 1)
            return InvalidArgument(std::string(ns ? "namespace" : "dict") +
                                   "(): expected keyword arguments or one mapping");
          d = a.positional[0].dict();
        }
        for (auto& [k, v] : a.named) d.Set(k, v);
        return ns ? Value::MakeNamespace(std::move(d)) : Value::MakeDict(std::move(d));
      });
    };
    g.try_emplace("namespace", make_dict(true));
    g.try_emplace("dict", make_dict(false));
    g.try_emplace(
        "range", Value::Function([this](CallArgs& a) -> StatusOr<Value> {
          int64_t v[3] = {0, 0, 1};
          const size_t n = a.positional.size();
          if (n < 1 || n > 3) return InvalidArgument("range() takes 1 to 3 integers");
          for (size_t i = 0; i < n; ++i)
            if (a.positional[i].kind() != Value::Kind::kInt)
              return InvalidArgument("range() takes integers");
          if (n == 1) {
            v[1] = a.positional[0].as_int();
          } else {
            v[0] = a.positional[0].as_int();
            v[1] = a.positional[1].as_int();
            if (n == 3) v[2] = a.positional[2].as_int();
          }
          if (v[2] == 0) return InvalidArgument("range() step must not be zero");
          const double count =
              (static_cast<double>(v[1]) - static_cast<double>(v[0])) / static_cast<double>(v[2]);
          if (count > static_cast<double>(kMaxRange))
            return InvalidArgument("range too big (more than " + std::to_string(kMaxRange) +
                                   " items, as jinja2's sandbox)");
          List out;
          for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
            TESSERA_RETURN_IF_ERROR(Step());
            out.push_back(Value::Int(i));
          }
          return Value::MakeList(std::move(out));
        }));
  }

  Status Step() {
    if (++steps_ > limits_.max_steps)
      return InvalidArgument("the template ran more than " + std::to_string(limits_.max_steps) +
                             " steps");
    return Status::Ok();
  }

  Status Emit(const std::string& s, std::string* out, int line) {
    out->append(s);
    if (out->size() > limits_.max_output_bytes)
      return LineError(
          line, "the rendered text exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
    return Status::Ok();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::Undefined(name);
  }

  Status Exec(const Body& body, std::string* out, Flow* flow) {
    for (const NodePtr& n : body) {
      TESSERA_RETURN_IF_ERROR(Step());
      TESSERA_RETURN_IF_ERROR(ExecNode(*n, out, flow));
      if (*flow != Flow::kNormal) return Status::Ok();
    }
    return Status::Ok();
  }

  Status Assign(const Node& n, const Value& v) {
    if (n.attr_target) {
      const Value ns = Lookup(n.targets[0]);
      if (ns.kind() != Value::Kind::kNamespace)
        return LineError(n.line, "cannot assign attribute '" + n.targets[1] + "' on '" +
                                     n.targets[0] + "' (not a namespace)");
      ns.dict().Set(n.targets[1], v);
      return Status::Ok();
    }
    return Bind(n.targets, v, n.line);
  }

  Status Bind(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return Status::Ok();
    }
    auto items = Iterate(v);
    if (!items.ok()) return AtLine(items.status(), line);
    if (items->size() != targets.size())
      return LineError(line, "cannot unpack " + std::to_string(items->size()) + " values into " +
                                 std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = (*items)[i];
    return Status::Ok();
  }

  Status ExecNode(const Node& n, std::string* out, Flow* flow) {
    switch (n.kind) {
      case Node::Kind::kText:
        return Emit(n.text, out, n.line);
      case Node::Kind::kOutput: {
        TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        auto s = v.ToPython();
        if (!s.ok()) return AtLine(s.status(), n.line);
        return Emit(*s, out, n.line);
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          TESSERA_ASSIGN_OR_RETURN(Value c, Eval(*cond));
          if (c.Truthy()) return Exec(body, out, flow);
        }
        return Exec(n.else_body, out, flow);
      case Node::Kind::kSet: {
        TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        return Assign(n, v);
      }
      case Node::Kind::kSetBlock: {
        std::string inner;
        Flow f = Flow::kNormal;
        TESSERA_RETURN_IF_ERROR(Exec(n.body, &inner, &f));
        return Bind(n.targets, Value::String(std::move(inner)), n.line);
      }
      case Node::Kind::kBreak:
        *flow = Flow::kBreak;
        return Status::Ok();
      case Node::Kind::kContinue:
        *flow = Flow::kContinue;
        return Status::Ok();
      case Node::Kind::kFor:
        return ExecFor(n, out);
      case Node::Kind::kMacro:
        scopes_.back()[n.macro_name] = MakeMacro(n);
        return Status::Ok();
    }
    return Status::Ok();
  }

  Status ExecFor(const Node& n, std::string* out) {
    TESSERA_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    auto all = Iterate(seq);
    if (!all.ok()) return AtLine(all.status(), n.line);
    scopes_.emplace_back();
    List items;
    if (n.filter) {
      for (const Value& x : *all) {
        TESSERA_RETURN_IF_ERROR(Step());
        TESSERA_RETURN_IF_ERROR(Bind(n.targets, x, n.line));
        TESSERA_ASSIGN_OR_RETURN(Value keep, Eval(*n.filter));
        if (keep.Truthy()) items.push_back(x);
      }
    } else {
      items = std::move(*all);
    }
    const auto len = static_cast<int64_t>(items.size());
    Status st;
    for (int64_t i = 0; i < len && st.ok(); ++i) {
      st = Step();
      if (!st.ok()) break;
      Dict loop;
      loop.items = {
          {"index", Value::Int(i + 1)},
          {"index0", Value::Int(i)},
          {"revindex", Value::Int(len - i)},
          {"revindex0", Value::Int(len - i - 1)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == len - 1)},
          {"length", Value::Int(len)},
          {"depth", Value::Int(1)},
          {"depth0", Value::Int(0)},
          {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("previtem")},
          {"nextitem",
           i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::Undefined("nextitem")}};
      scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
      st = Bind(n.targets, items[static_cast<size_t>(i)], n.line);
      if (!st.ok()) break;
      Flow f = Flow::kNormal;
      st = Exec(n.body, out, &f);
      if (f == Flow::kBreak) break;
    }
    scopes_.pop_back();
    TESSERA_RETURN_IF_ERROR(st);
    if (len == 0) {
      Flow f = Flow::kNormal;
      return Exec(n.else_body, out, &f);
    }
    return Status::Ok();
  }

  Value MakeMacro(const Node& n) {
    const Node* node = &n;
    return Value::Function([this, node](CallArgs& a) -> StatusOr<Value> {
      if (++call_depth_ > limits_.max_call_depth) {
        --call_depth_;
        return InvalidArgument("macro calls nested deeper than " +
                               std::to_string(limits_.max_call_depth));
      }
      if (a.positional.size() > node->params.size())
        return InvalidArgument("macro '" + node->macro_name + "' takes " +
                               std::to_string(node->params.size()) + " arguments");
      // A macro sees the globals and top-level names, plus its parameters.
      std::vector<Scope> saved;
      saved.assign(scopes_.begin() + 1, scopes_.end());
      scopes_.resize(1);
      scopes_.emplace_back();
      Status st;
      for (size_t i = 0; i < node->params.size() && st.ok(); ++i) {
        const auto& [pname, def] = node->params[i];
        Value v = Value::Undefined(pname);
        if (i < a.positional.size()) {
          v = a.positional[i];
        } else {
          bool found = false;
          for (auto& [k, x] : a.named) {
            if (k == pname) {
              v = x;
              found = true;
            }
          }
          if (!found && def) {
            auto d = Eval(*def);
            if (!d.ok())
              st = d.status();
            else
              v = *d;
          }
        }
        scopes_.back()[pname] = v;
      }
      std::string text;
      if (st.ok()) {
        Flow f = Flow::kNormal;
        st = Exec(node->body, &text, &f);
      }
      scopes_.resize(1);
      for (auto& s : saved) scopes_.push_back(std::move(s));
      --call_depth_;
      if (!st.ok()) return st;
      return Value::String(std::move(text));
    });
  }

  StatusOr<Value> Eval(const Expr& e) {
    auto r = EvalInner(e);
    if (!r.ok()) return AtLine(r.status(), e.line);
    return r;
  }

  StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      a.positional.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*x));
      a.named.emplace_back(k, std::move(v));
    }
    return a;
  }

  static StatusOr<Value> Arith(const std::string& op, const Value& a, const Value& b) {
    using K = Value::Kind;
    auto type_error = [&]() {
      return InvalidArgument("unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                             "' and '" + b.TypeName() + "'");
    };
    if (a.is_undefined() || b.is_undefined())
      return InvalidArgument("'" + (a.is_undefined() ? a.str() : b.str()) +
                             "' is undefined (used with " + op + ")");
    const bool an = a.is_number() || a.kind() == K::kBool;
    const bool bn = b.is_number() || b.kind() == K::kBool;
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (a.str().size() + b.str().size() > kMaxStringBytes)
          return InvalidArgument("string too large");
        return Value::String(a.str() + b.str());
      }
      if (a.is_list() && b.is_list()) {
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        if (l.size() > kMaxListItems) return InvalidArgument("list too large");
        return Value::MakeList(std::move(l));
      }
    }
    if (op == "*" && ((a.is_string() || a.is_list()) && b.kind() == K::kInt)) {
      const int64_t n = std::max<int64_t>(b.as_int(), 0);
      const size_t unit = a.is_string() ? a.str().size() : a.list().size();
      const size_t cap = a.is_string() ? kMaxStringBytes : kMaxListItems;
      if (unit != 0 && static_cast<uint64_t>(n) > cap / unit)
        return InvalidArgument("repetition result too large");
      if (a.is_string()) {
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += a.str();
        return Value::String(std::move(s));
      }
      List l;
      for (int64_t i = 0; i < n; ++i) l.insert(l.end(), a.list().begin(), a.list().end());
      return Value::MakeList(std::move(l));
    }
    if (!an || !bn) return type_error();
    const bool fl = a.kind() == K::kFloat || b.kind() == K::kFloat;
    if (op == "/") {
      if (b.as_double() == 0) return InvalidArgument("division by zero");
      return Value::Float(a.as_double() / b.as_double());
    }
    if (op == "**") {
      if (!fl && b.as_int() >= 0 && b.as_int() < 64) {
        const double r = std::pow(a.as_double(), b.as_double());
        if (std::fabs(r) < 9e18) return Value::Int(static_cast<int64_t>(r));
        return InvalidArgument("integer too large");
      }
      return Value::Float(std::pow(a.as_double(), b.as_double()));
    }
    if (fl) {
      const double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::Float(x + y);
      if (op == "-") return Value::Float(x - y);
      if (op == "*") return Value::Float(x * y);
      if (y == 0) return InvalidArgument("division by zero");
      if (op == "//") return Value::Float(std::floor(x / y));
      if (op == "%") return Value::Float(x - std::floor(x / y) * y);
    } else {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::Int(r);
      if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::Int(r);
      if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::Int(r);
      if (op == "+" || op == "-" || op == "*") return InvalidArgument("integer overflow");
      if (y == 0) return InvalidArgument("integer division or modulo by zero");
      // The one quotient that does not fit (x86 traps on it).
      if (x == std::numeric_limits<int64_t>::min() && y == -1) {
        if (op == "//") return InvalidArgument("integer overflow");
        return Value::Int(0);
      }
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::Int(op == "//" ? q : m);
    }
    return type_error();
  }

  StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return a.Equals(b);
    if (op == "!=") return !a.Equals(b);
    if (op == "in") return Contains(b, a);
    if (op == "notin") {
      TESSERA_ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    if (op == "<") return Value::Less(a, b);
    if (op == ">") return Value::Less(b, a);
    if (op == "<=") {
      TESSERA_ASSIGN_OR_RETURN(bool gt, Value::Less(b, a));
      return !gt;
    }
    TESSERA_ASSIGN_OR_RETURN(bool lt, Value::Less(a, b));
    return !lt;
  }

  StatusOr<Value> EvalInner(const Expr& e) {
    TESSERA_RETURN_IF_ERROR(Step());
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kLiteral:
        return e.literal;
      case K::kName:
        return Lookup(e.name);
      case K::kList: {
        List l;
        for (const ExprPtr& x : e.args) {
          TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*x));
          l.push_back(std::move(v));
        }
        return Value::MakeList(std::move(l));
      }
      case K::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          TESSERA_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string()) return InvalidArgument("dict keys must be strings");
          d.Set(k.str(), std::move(v));
        }
        return Value::MakeDict(std::move(d));
      }
      case K::kAttr: {
        TESSERA_ASSIGN_OR_RETURN(Value o, Eval(*e.args[0]));
        return GetAttr(o, e.name);
      }
      case K::kItem: {
        TESSERA_ASSIGN_OR_RETURN(Value o, Eval(*e.args[0]));
        TESSERA_ASSIGN_OR_RETURN(Value k, Eval(*e.args[1]));
        return GetItem(o, k);
      }
      case K::kSlice: {
        TESSERA_ASSIGN_OR_RETURN(Value o, Eval(*e.args[0]));
        Value parts[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < 3; ++i) {
          if (!e.args[static_cast<size_t>(i) + 1]) continue;
          TESSERA_ASSIGN_OR_RETURN(parts[i], Eval(*e.args[static_cast<size_t>(i) + 1]));
          ptrs[i] = &parts[i];
        }
        return Slice(o, ptrs[0], ptrs[1], ptrs[2]);
      }
      case K::kCall: {
        TESSERA_ASSIGN_OR_RETURN(Value f, Eval(*e.args[0]));
        TESSERA_ASSIGN_OR_RETURN(CallArgs a, EvalArgs(e, 1));
        if (f.kind() != Value::Kind::kCallable) {
          if (f.is_undefined()) return InvalidArgument("'" + f.str() + "' is undefined (called)");
          return InvalidArgument(std::string("'") + f.TypeName() + "' object is not callable");
        }
        return f.fn()(a);
      }
      case K::kFilter: {
        TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        TESSERA_ASSIGN_OR_RETURN(CallArgs a, EvalArgs(e, 1));
        auto r = ApplyFilter(e.name, v, a);
        if (!r.ok()) return InvalidArgument("filter '" + e.name + "': " + r.status().message());
        return r;
      }
      case K::kTest: {
        Value v;
        if (e.args[0]->kind == K::kName) {
          v = Lookup(e.args[0]->name);
        } else {
          TESSERA_ASSIGN_OR_RETURN(v, Eval(*e.args[0]));
        }
        TESSERA_ASSIGN_OR_RETURN(CallArgs a, EvalArgs(e, 1));
        TESSERA_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, v, a));
        return Value::Bool(r != e.negated);
      }
      case K::kUnary: {
        TESSERA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.kind() == Value::Kind::kFloat)
          return Value::Float(e.name == "-" ? -v.as_double() : v.as_double());
        if (v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool) {
          int64_t r = v.as_int();
          if (e.name == "-" && __builtin_sub_overflow(int64_t{0}, v.as_int(), &r))
            return InvalidArgument("integer overflow");
          return Value::Int(r);
        }
        return InvalidArgument(std::string("bad operand type for unary ") + e.name + ": '" +
                               v.TypeName() + "'");
      }
      case K::kBinary: {
        TESSERA_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (e.name == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
        if (e.name == "or") return a.Truthy() ? a : Eval(*e.args[1]);
        TESSERA_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        if (e.name == "~") {
          TESSERA_ASSIGN_OR_RETURN(std::string x, a.ToPython());
          TESSERA_ASSIGN_OR_RETURN(std::string y, b.ToPython());
          if (x.size() + y.size() > kMaxStringBytes) return InvalidArgument("string too large");
          return Value::String(x + y);
        }
        return Arith(e.name, a, b);
      }
      case K::kCompare: {
        TESSERA_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          TESSERA_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          TESSERA_ASSIGN_OR_RETURN(bool ok, Compare(e.ops[i], left, right));
          if (!ok) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case K::kCond: {
        TESSERA_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (!e.args[2]) return Value::Undefined("conditional expression");
        return Eval(*e.args[2]);
      }
    }
    return Value();
  }

  const RenderLimits& limits_;
  std::vector<Scope> scopes_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

StatusOr<std::string> Render(const Template& tpl, const Dict& context, const RenderLimits& limits) {
  Renderer r(context, limits);
  std::string out;
  TESSERA_RETURN_IF_ERROR(r.Run(tpl.body, &out));
  return out;
}

}  // namespace tessera::jinja
