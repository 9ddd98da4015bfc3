// The syntax tree of a chat template and its parser. The parser is the gate:
// a construct the renderer does not implement (a tag such as include/extends/
// call/filter blocks, a filter, test or method it lacks, a recursive loop) is
// refused here, when the model loads, with the construct and its line, so a
// template that parses renders as jinja2 does or fails with an error.
//
// Supported: text, {{ expr }}, {% if/elif/else %}, {% for a[, b] in x [if c]
// %}...{% else %}, {% set x = e %}, {% set ns.attr = e %}, {% set x %}block{%
// endset %}, {% macro %}, {% break/continue %}, {% generation %} (a no-op,
// as rendering for text has it); expressions with jinja2's precedence.
//
// Thread-safety: the tree is immutable after Parse; share it freely.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/tokenizer/jinja_value.h"

namespace tessera::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args (tuples too)
    kDict,     // args: key, value, key, value, ...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]], each may be null
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name: "-", "+", "not"
    kBinary,   // name: + - * / // % ** ~ and or
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...
    kCond,     // args[0] if args[1] else args[2] (null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: == != < <= > >= in notin
  bool negated = false;          // kTest: "is not"
};

struct Node;
using NodePtr = std::shared_ptr<const Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput, kSet value, kFor iterable
  std::vector<std::string> targets;  // kFor/kSet names; kSet {ns, attr} when attr_target
  bool attr_target = false;          // kSet: {% set ns.attr = ... %}
  ExprPtr filter;                    // kFor: "if" condition
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf: (condition, body)...
  Body body;                                            // kFor, kSetBlock, kMacro
  Body else_body;                                       // kIf, kFor
  std::string macro_name;                               // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default (may be null)
};

struct Template {
  Body body;
};

// Errors: kInvalidArgument "chat_template line N: ..." naming the
// unsupported construct or the syntax error.
StatusOr<Template> Parse(std::string_view source);

}  // namespace tessera::jinja
