#include "common/tokenizer/jinja_parser.h"

#include <set>

#include "common/tokenizer/jinja_lexer.h"

namespace tessera::jinja {

namespace {

// What the renderer implements (jinja_render.cc); anything else is refused.
const std::set<std::string, std::less<>> kFilters = {
    "abs",        "attr",   "capitalize", "count",   "d",       "default", "dictsort",
    "e",          "escape", "first",      "float",   "indent",  "int",     "items",
    "join",       "last",   "length",     "list",    "lower",   "map",     "max",
    "min",        "reject", "rejectattr", "replace", "reverse", "safe",    "select",
    "selectattr", "sort",   "string",     "sum",     "title",   "tojson",  "trim",
    "unique",     "upper",  "wordcount"};
const std::set<std::string, std::less<>> kTests = {
    "boolean", "callable", "defined",  "divisibleby", "eq",   "equalto",   "even",
    "false",   "float",    "ge",       "gt",          "in",   "integer",   "iterable",
    "le",      "lower",    "lt",       "mapping",     "ne",   "none",      "number",
    "odd",     "sameas",   "sequence", "string",      "true", "undefined", "upper"};
const std::set<std::string, std::less<>> kMethods = {
    "capitalize", "count",      "endswith",   "find",    "get",     "index",  "isalnum",
    "isalpha",    "isdigit",    "islower",    "isspace", "isupper", "items",  "join",
    "keys",       "lower",      "lstrip",     "replace", "rfind",   "rsplit", "rstrip",
    "split",      "splitlines", "startswith", "strip",   "title",   "upper",  "values"};

constexpr int kMaxDepth = 200;  // expression and block nesting

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  StatusOr<Template> Run() {
    Template tpl;
    std::string stop;
    TESSERA_ASSIGN_OR_RETURN(tpl.body, ParseBody({}, &stop));
    return tpl;
  }

 private:
  const Token& Cur() const { return t_[i_]; }
  const Token& Next() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return Cur().type == TokenType::kOp && Cur().text == op; }
  bool IsName(const char* n) const { return Cur().type == TokenType::kName && Cur().text == n; }
  Status Err(const std::string& what) const { return Err(Cur().line, what); }
  static Status Err(int line, const std::string& what) {
    return InvalidArgument("chat_template line " + std::to_string(line) + ": " + what);
  }
  std::string Describe() const {
    switch (Cur().type) {
      case TokenType::kEof:
        return "end of template";
      case TokenType::kVarEnd:
        return "'}}'";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kString:
        return "a string";
      default:
        return "'" + Cur().text + "'";
    }
  }
  Status Expect(const char* op) {
    if (!IsOp(op)) return Err(std::string("expected '") + op + "', found " + Describe());
    ++i_;
    return Status::Ok();
  }
  Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Err("expected '%}', found " + Describe());
    ++i_;
    return Status::Ok();
  }
  StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Err("expected a name, found " + Describe());
    return t_[i_++].text;
  }

  // Parses nodes until a block tag whose name is in `stops` (consumed up to
  // its name; *stop = that name) or the end of the template (stops empty).
  StatusOr<Body> ParseBody(const std::set<std::string>& stops, std::string* stop) {
    if (++block_depth_ > kMaxDepth) return Err("blocks nested too deeply");
    Body body;
    while (true) {
      const Token& tok = Cur();
      if (tok.type == TokenType::kEof) {
        if (!stops.empty()) {
          std::string end = *stops.begin();
          for (const std::string& s : stops)
            if (s.rfind("end", 0) == 0) end = s;
          return Err("unexpected end of template (expected " + end + ")");
        }
        break;
      }
      if (tok.type == TokenType::kText) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kText;
        n->line = tok.line;
        n->text = tok.text;
        body.push_back(n);
        ++i_;
        continue;
      }
      if (tok.type == TokenType::kVarBegin) {
        ++i_;
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = tok.line;
        TESSERA_ASSIGN_OR_RETURN(n->expr, ParseExpr());
        if (Cur().type != TokenType::kVarEnd) return Err("expected '}}', found " + Describe());
        ++i_;
        body.push_back(n);
        continue;
      }
      // Block tag.
      ++i_;
      if (Cur().type != TokenType::kName) return Err("expected a tag name, found " + Describe());
      const std::string name = Cur().text;
      const int line = Cur().line;
      if (stops.count(name)) {
        ++i_;
        *stop = name;
        --block_depth_;
        return body;
      }
      ++i_;
      NodePtr n;
      if (name == "if") {
        TESSERA_ASSIGN_OR_RETURN(n, ParseIf(line));
      } else if (name == "for") {
        TESSERA_ASSIGN_OR_RETURN(n, ParseFor(line));
      } else if (name == "set") {
        TESSERA_ASSIGN_OR_RETURN(n, ParseSet(line));
      } else if (name == "macro") {
        TESSERA_ASSIGN_OR_RETURN(n, ParseMacro(line));
      } else if (name == "break" || name == "continue") {
        if (loops_ == 0) return Err(line, "'" + name + "' outside a loop");
        auto b = std::make_shared<Node>();
        b->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
        b->line = line;
        TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
        n = b;
      } else if (name == "generation") {
        // transformers' {% generation %} marks assistant tokens; for text it
        // renders its body unchanged.
        TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
        std::string s;
        TESSERA_ASSIGN_OR_RETURN(Body inner, ParseBody({"endgeneration"}, &s));
        TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
        for (auto& x : inner) body.push_back(x);
        continue;
      } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
        return Err(line, "unexpected '" + name + "'");
      } else {
        return Err(line, "unsupported tag '" + name + "'");
      }
      body.push_back(n);
    }
    --block_depth_;
    return body;
  }

  StatusOr<NodePtr> ParseIf(int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kIf;
    n->line = line;
    while (true) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpr());
      TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string stop;
      TESSERA_ASSIGN_OR_RETURN(Body b, ParseBody({"elif", "else", "endif"}, &stop));
      n->branches.emplace_back(cond, std::move(b));
      if (stop == "elif") continue;
      TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
      if (stop == "else") {
        TESSERA_ASSIGN_OR_RETURN(n->else_body, ParseBody({"endif"}, &stop));
        TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
      }
      return NodePtr(n);
    }
  }

  StatusOr<NodePtr> ParseFor(int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kFor;
    n->line = line;
    const bool paren = IsOp("(");
    if (paren) ++i_;
    while (true) {
      TESSERA_ASSIGN_OR_RETURN(std::string v, ExpectName());
      n->targets.push_back(v);
      if (!IsOp(",")) break;
      ++i_;
    }
    if (paren) TESSERA_RETURN_IF_ERROR(Expect(")"));
    if (!IsName("in")) return Err("expected 'in', found " + Describe());
    ++i_;
    TESSERA_ASSIGN_OR_RETURN(n->expr, ParseOr(0));  // no ternary: "if" filters
    if (IsName("if")) {
      ++i_;
      TESSERA_ASSIGN_OR_RETURN(n->filter, ParseOr(0));
    }
    if (IsName("recursive")) return Err("unsupported construct 'recursive' loop");
    TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
    ++loops_;
    std::string stop;
    TESSERA_ASSIGN_OR_RETURN(n->body, ParseBody({"else", "endfor"}, &stop));
    --loops_;
    TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
    if (stop == "else") {
      TESSERA_ASSIGN_OR_RETURN(n->else_body, ParseBody({"endfor"}, &stop));
      TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
    }
    return NodePtr(n);
  }

  StatusOr<NodePtr> ParseSet(int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kSet;
    n->line = line;
    TESSERA_ASSIGN_OR_RETURN(std::string first, ExpectName());
    n->targets.push_back(first);
    if (IsOp(".")) {
      ++i_;
      TESSERA_ASSIGN_OR_RETURN(std::string attr, ExpectName());
      n->targets.push_back(attr);
      n->attr_target = true;
    } else {
      while (IsOp(",")) {
        ++i_;
        TESSERA_ASSIGN_OR_RETURN(std::string v, ExpectName());
        n->targets.push_back(v);
      }
    }
    if (Cur().type == TokenType::kBlockEnd && !n->attr_target && n->targets.size() == 1) {
      ++i_;
      n->kind = Node::Kind::kSetBlock;
      std::string stop;
      TESSERA_ASSIGN_OR_RETURN(n->body, ParseBody({"endset"}, &stop));
      TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
      return NodePtr(n);
    }
    TESSERA_RETURN_IF_ERROR(Expect("="));
    TESSERA_ASSIGN_OR_RETURN(n->expr, ParseTuple());
    TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
    return NodePtr(n);
  }

  StatusOr<NodePtr> ParseMacro(int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::kMacro;
    n->line = line;
    TESSERA_ASSIGN_OR_RETURN(n->macro_name, ExpectName());
    TESSERA_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      TESSERA_ASSIGN_OR_RETURN(std::string p, ExpectName());
      ExprPtr def;
      if (IsOp("=")) {
        ++i_;
        TESSERA_ASSIGN_OR_RETURN(def, ParseExpr());
      }
      n->params.emplace_back(p, def);
      if (!IsOp(",")) break;
      ++i_;
    }
    TESSERA_RETURN_IF_ERROR(Expect(")"));
    TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string stop;
    const int loops = loops_;
    loops_ = 0;
    TESSERA_ASSIGN_OR_RETURN(n->body, ParseBody({"endmacro"}, &stop));
    loops_ = loops;
    TESSERA_RETURN_IF_ERROR(ExpectBlockEnd());
    return NodePtr(n);
  }

  // ---- Expressions (jinja2's precedence) ----

  static std::shared_ptr<Expr> Make(Expr::Kind k, int line) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // "a, b" at the top of a set: a tuple (list).
  StatusOr<ExprPtr> ParseTuple() {
    const int line = Cur().line;
    TESSERA_ASSIGN_OR_RETURN(ExprPtr first, ParseExpr());
    if (!IsOp(",")) return first;
    auto list = Make(Expr::Kind::kList, line);
    list->args.push_back(first);
    while (IsOp(",")) {
      ++i_;
      if (Cur().type == TokenType::kBlockEnd) break;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
      list->args.push_back(e);
    }
    return ExprPtr(list);
  }

  StatusOr<ExprPtr> ParseExpr() {
    if (++depth_ > kMaxDepth) return Err("expression nested too deeply");
    const int line = Cur().line;
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, ParseOr(0));
    while (IsName("if")) {
      ++i_;
      auto c = Make(Expr::Kind::kCond, line);
      TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr(0));
      ExprPtr other;
      if (IsName("else")) {
        ++i_;
        TESSERA_ASSIGN_OR_RETURN(other, ParseExpr());
      }
      c->args = {e, cond, other};
      e = c;
    }
    --depth_;
    return e;
  }

  // Levels: 0 or, 1 and, 2 not, 3 compare, 4 + -, 5 ~, 6 * / // %, 7 **.
  StatusOr<ExprPtr> ParseOr(int level) {
    if (++depth_ > kMaxDepth) return Err("expression nested too deeply");
    const int line = Cur().line;
    StatusOr<ExprPtr> r = ParseLevel(level, line);
    --depth_;
    return r;
  }

  StatusOr<ExprPtr> ParseLevel(int level, int line) {
    if (level == 2) {
      if (IsName("not")) {
        ++i_;
        auto u = Make(Expr::Kind::kUnary, line);
        u->name = "not";
        TESSERA_ASSIGN_OR_RETURN(ExprPtr a, ParseOr(2));
        u->args = {a};
        return ExprPtr(u);
      }
      return ParseOr(3);
    }
    if (level == 3) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr left, ParseOr(4));
      std::shared_ptr<Expr> cmp;
      while (true) {
        std::string op;
        if (Cur().type == TokenType::kOp &&
            (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
             Cur().text == ">" || Cur().text == ">=")) {
          op = Cur().text;
          ++i_;
        } else if (IsName("in")) {
          op = "in";
          ++i_;
        } else if (IsName("not") && Next().type == TokenType::kName && Next().text == "in") {
          op = "notin";
          i_ += 2;
        } else {
          break;
        }
        if (!cmp) {
          cmp = Make(Expr::Kind::kCompare, line);
          cmp->args.push_back(left);
        }
        TESSERA_ASSIGN_OR_RETURN(ExprPtr right, ParseOr(4));
        cmp->ops.push_back(op);
        cmp->args.push_back(right);
      }
      return cmp ? ExprPtr(cmp) : left;
    }
    if (level == 8) return ParseUnary();
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, ParseOr(level + 1));
    while (true) {
      std::string op;
      if (level == 0 && IsName("or")) op = "or";
      if (level == 1 && IsName("and")) op = "and";
      if (Cur().type == TokenType::kOp) {
        const std::string& t = Cur().text;
        if (level == 4 && (t == "+" || t == "-")) op = t;
        if (level == 5 && t == "~") op = t;
        if (level == 6 && (t == "*" || t == "/" || t == "//" || t == "%")) op = t;
        if (level == 7 && t == "**") op = t;
      }
      if (op.empty()) return left;
      ++i_;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, ParseOr(level + 1));
      auto b = Make(Expr::Kind::kBinary, line);
      b->name = op;
      b->args = {left, right};
      left = b;
    }
  }

  StatusOr<ExprPtr> ParseUnary() {
    const int line = Cur().line;
    if (IsOp("-") || IsOp("+")) {
      auto u = Make(Expr::Kind::kUnary, line);
      u->name = Cur().text;
      ++i_;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr a, ParseUnaryNoFilter());
      u->args = {a};
      return ParseFilters(u);
    }
    TESSERA_ASSIGN_OR_RETURN(ExprPtr p, ParsePrimary());
    TESSERA_ASSIGN_OR_RETURN(p, ParsePostfix(p));
    return ParseFilters(p);
  }

  StatusOr<ExprPtr> ParseUnaryNoFilter() {
    if (++depth_ > kMaxDepth) return Err("expression nested too deeply");
    const int line = Cur().line;
    if (IsOp("-") || IsOp("+")) {
      auto u = Make(Expr::Kind::kUnary, line);
      u->name = Cur().text;
      ++i_;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr a, ParseUnaryNoFilter());
      u->args = {a};
      --depth_;
      return ExprPtr(u);
    }
    TESSERA_ASSIGN_OR_RETURN(ExprPtr p, ParsePrimary());
    --depth_;
    return ParsePostfix(p);
  }

  Status ParseCallArgs(Expr* e) {
    TESSERA_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (Cur().type == TokenType::kName && Next().type == TokenType::kOp && Next().text == "=") {
        const std::string k = Cur().text;
        i_ += 2;
        TESSERA_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        e->kwargs.emplace_back(k, v);
      } else {
        if (IsOp("*") || IsOp("**")) return Err("unsupported construct '*args' in a call");
        if (!e->kwargs.empty()) return Err("positional argument after a keyword argument");
        TESSERA_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        e->args.push_back(v);
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    return Expect(")");
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      const int line = Cur().line;
      if (IsOp(".")) {
        ++i_;
        auto a = Make(Expr::Kind::kAttr, line);
        if (Cur().type == TokenType::kInt) {
          a->kind = Expr::Kind::kItem;
          auto k = Make(Expr::Kind::kLiteral, line);
          k->literal = Value::Int(std::stoll(Cur().text));
          ++i_;
          a->args = {e, k};
        } else {
          TESSERA_ASSIGN_OR_RETURN(a->name, ExpectName());
          a->args = {e};
        }
        e = a;
      } else if (IsOp("[")) {
        ++i_;
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
          if (!IsOp(":") && !IsOp("]")) {
            TESSERA_ASSIGN_OR_RETURN(parts[n], ParseExpr());
          }
          if (IsOp(":") && n < 2) {
            slice = true;
            ++i_;
            ++n;
            continue;
          }
          break;
        }
        TESSERA_RETURN_IF_ERROR(Expect("]"));
        auto s = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
        if (!slice && !parts[0]) return Err(line, "empty subscript");
        s->args = slice ? std::vector<ExprPtr>{e, parts[0], parts[1], parts[2]}
                        : std::vector<ExprPtr>{e, parts[0]};
        e = s;
      } else if (IsOp("(")) {
        if (e->kind == Expr::Kind::kAttr && !kMethods.count(e->name))
          return Err(line, "unsupported method '" + e->name + "'");
        auto c = Make(Expr::Kind::kCall, line);
        c->args.push_back(e);
        TESSERA_RETURN_IF_ERROR(ParseCallArgs(c.get()));
        e = c;
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      const int line = Cur().line;
      if (IsOp("|")) {
        ++i_;
        TESSERA_ASSIGN_OR_RETURN(std::string name, ExpectName());
        if (!kFilters.count(name)) return Err(line, "unsupported filter '" + name + "'");
        auto f = Make(Expr::Kind::kFilter, line);
        f->name = name;
        f->args.push_back(e);
        if (IsOp("(")) TESSERA_RETURN_IF_ERROR(ParseCallArgs(f.get()));
        e = f;
      } else if (IsName("is")) {
        ++i_;
        auto t = Make(Expr::Kind::kTest, line);
        if (IsName("not")) {
          t->negated = true;
          ++i_;
        }
        TESSERA_ASSIGN_OR_RETURN(t->name, ExpectName());
        if (!kTests.count(t->name)) return Err(line, "unsupported test '" + t->name + "'");
        t->args.push_back(e);
        if (IsOp("(")) {
          TESSERA_RETURN_IF_ERROR(ParseCallArgs(t.get()));
        } else if ((Cur().type == TokenType::kName && !IsName("else") && !IsName("or") &&
                    !IsName("and") && !IsName("if") && !IsName("in") && !IsName("not") &&
                    !IsName("is")) ||
                   Cur().type == TokenType::kString || Cur().type == TokenType::kInt ||
                   Cur().type == TokenType::kFloat || IsOp("[") || IsOp("{")) {
          TESSERA_ASSIGN_OR_RETURN(ExprPtr a, ParsePrimary());
          TESSERA_ASSIGN_OR_RETURN(a, ParsePostfix(a));
          t->args.push_back(a);
        }
        e = t;
      } else if (IsOp("(")) {
        auto c = Make(Expr::Kind::kCall, line);
        c->args.push_back(e);
        TESSERA_RETURN_IF_ERROR(ParseCallArgs(c.get()));
        e = c;
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParsePrimary() {
    const Token& tok = Cur();
    const int line = tok.line;
    auto lit = Make(Expr::Kind::kLiteral, line);
    switch (tok.type) {
      case TokenType::kName: {
        ++i_;
        if (tok.text == "true" || tok.text == "True") {
          lit->literal = Value::Bool(true);
        } else if (tok.text == "false" || tok.text == "False") {
          lit->literal = Value::Bool(false);
        } else if (tok.text == "none" || tok.text == "None") {
          lit->literal = Value::None();
        } else {
          lit->kind = Expr::Kind::kName;
          lit->name = tok.text;
        }
        return ExprPtr(lit);
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) s += t_[i_++].text;
        lit->literal = Value::String(std::move(s));
        return ExprPtr(lit);
      }
      case TokenType::kInt:
        ++i_;
        try {
          lit->literal = Value::Int(std::stoll(tok.text));
        } catch (...) {
          return Err(line, "integer literal out of range");
        }
        return ExprPtr(lit);
      case TokenType::kFloat:
        ++i_;
        lit->literal = Value::Float(std::stod(tok.text));
        return ExprPtr(lit);
      case TokenType::kOp:
        if (tok.text == "(") {
          ++i_;
          auto list = Make(Expr::Kind::kList, line);
          bool tuple = false;
          while (!IsOp(")")) {
            TESSERA_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
            list->args.push_back(e);
            if (!IsOp(",")) break;
            tuple = true;
            ++i_;
          }
          TESSERA_RETURN_IF_ERROR(Expect(")"));
          if (!tuple && list->args.size() == 1) return list->args[0];
          return ExprPtr(list);
        }
        if (tok.text == "[" || tok.text == "{") {
          const bool dict = tok.text == "{";
          ++i_;
          auto c = Make(dict ? Expr::Kind::kDict : Expr::Kind::kList, line);
          const char* close = dict ? "}" : "]";
          while (!IsOp(close)) {
            TESSERA_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
            c->args.push_back(e);
            if (dict) {
              TESSERA_RETURN_IF_ERROR(Expect(":"));
              TESSERA_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
              c->args.push_back(v);
            }
            if (!IsOp(",")) break;
            ++i_;
          }
          TESSERA_RETURN_IF_ERROR(Expect(close));
          return ExprPtr(c);
        }
        break;
      default:
        break;
    }
    return Err("unexpected " + Describe());
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;        // expressions
  int block_depth_ = 0;  // blocks
  int loops_ = 0;
};

}  // namespace

StatusOr<Template> Parse(std::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<Token> toks, Lex(source));
  return Parser(std::move(toks)).Run();
}

}  // namespace tessera::jinja
