// Feature tests of the chat-template interpreter: each construct, whitespace
// control, filters, undefined, runtime errors with their line, constructs
// refused at parse, and the limits that bound a hostile template.
#include "common/tokenizer/jinja_render.h"

#include <gtest/gtest.h>

#include <string>

#include "common/tokenizer/jinja_parser.h"

namespace tessera::jinja {
namespace {

Dict Ctx() {
  Dict d;
  d.Set("messages", Value::FromJson(nlohmann::ordered_json::parse(
                        R"([{"role":"system","content":" sys "},{"role":"user","content":"hi"},)"
                        R"({"role":"assistant","content":"yo"}])")));
  d.Set("name", Value::String("Ada"));
  d.Set("n", Value::Int(3));
  d.Set("obj", Value::FromJson(nlohmann::ordered_json::parse(
                   R"({"b":1,"a":[1,2.5,"x",null,true],"s":"é\"\n"})")));
  return d;
}

std::string R(const std::string& src, const RenderLimits& limits = {}) {
  auto tpl = Parse(src);
  if (!tpl.ok()) return "PARSE: " + tpl.status().message();
  auto out = Render(*tpl, Ctx(), limits);
  if (!out.ok()) return "ERROR: " + out.status().message();
  return *out;
}

TEST(JinjaRender, TextOutputAndLiterals) {
  EXPECT_EQ(R("a{{ name }}b"), "aAdab");
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 1 / 2 }}"),
            "7 3 -4 1 2 0.5");
  EXPECT_EQ(R("{{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}"),
            "1024 a1None abab [1, 2]");
  EXPECT_EQ(R("{{ true }} {{ none }} {{ 1.0 }} {{ 1e-5 }} {{ [1, 'a', {'k': none}] }}"),
            "True None 1.0 1e-05 [1, 'a', {'k': None}]");
  EXPECT_EQ(R("{{ 'it\\'s' }} {{ \"a\\tb\" }} {{ 'x' 'y' }}"), "it's a\tb xy");
  EXPECT_EQ(R("{{ 'yes' if n > 2 else 'no' }}{{ 'never' if false }}"), "yes");
}

TEST(JinjaRender, WhitespaceControlAsTransformers) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the
  // indentation before it; "-" strips all whitespace on its side.
  EXPECT_EQ(R("{% if true %}\n  x\n{% endif %}\ny"), "  x\ny");
  EXPECT_EQ(R("a\n    {% if true %}b{% endif %}"), "a\nb");
  EXPECT_EQ(R("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(R("a\n  {%- if true %} b {% endif -%}\n  c"), "a b c");
  EXPECT_EQ(R("a {# note #}\nb"), "a b");
  EXPECT_EQ(R("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(R("x\n"), "x");  // one trailing newline goes
}

TEST(JinjaRender, ForLoopVariablesElseAndFilter) {
  EXPECT_EQ(R("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
              "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
            "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
  EXPECT_EQ(R("{% for m in messages if m.role != 'system' %}{{ m.role }}{{ loop.length }}"
              "{% endfor %}"),
            "user2assistant2");
  EXPECT_EQ(R("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}"),
            "-2,1-3,2-,");
  EXPECT_EQ(R("{% for k, v in obj.items() %}{{ k }}={{ v|length if v is iterable else v }};"
              "{% endfor %}"),
            "b=1;a=5;s=3;");
  EXPECT_EQ(R("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}"
              "{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(R("{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}"), "aus");
}

TEST(JinjaRender, SetNamespaceAndScoping) {
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(R("{% set ns = namespace(c=0) %}{% for i in [1,2] %}{% set ns.c = ns.c + i %}"
              "{% endfor %}{{ ns.c }}"),
            "3");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(R("{% set block %}x{{ n }}{% endset %}[{{ block }}]"), "[x3]");
  EXPECT_EQ(R("{% macro tag(x, y='!') %}<{{ x }}{{ y }}>{% endmacro %}{{ tag('a') }}"
              "{{ tag('b', y='?') }}"),
            "<a!><b?>");
}

TEST(JinjaRender, TestsAndOperators) {
  EXPECT_EQ(R("{{ undefined_thing is defined }}{{ name is defined }}{{ none is none }}"
              "{{ name is string }}{{ obj is mapping }}{{ obj.a is iterable }}"
              "{{ n is number }}{{ n is not divisibleby 2 }}{{ 'u' in 'user' }}"
              "{{ 3 not in [1, 2] }}{{ 'b' in obj }}{{ 1 < n <= 3 }}"),
            "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(R("{{ not name }}{{ name and 0 }}{{ 0 or 'z' }}{{ n == 3.0 }}{{ [1,2] == [1,2] }}"),
            "False0zTrueTrue");
}

TEST(JinjaRender, Filters) {
  EXPECT_EQ(R("{{ messages[0].content|trim }}|{{ name|upper }}{{ name|lower }}"
              "{{ 'hello world'|capitalize }}{{ 'hello world'|title }}"),
            "sys|ADAadaHello worldHello World");
  EXPECT_EQ(R("{{ obj|tojson }}"), R"({"b": 1, "a": [1, 2.5, "x", null, true], "s": "é\"\n"})");
  EXPECT_EQ(R("{{ obj.a|tojson(indent=2) }}"), "[\n  1,\n  2.5,\n  \"x\",\n  null,\n  true\n]");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}{{ 'é'|tojson(true) }}"),
            R"({"a": 2, "b": 1}"\u00e9")");
  EXPECT_EQ(R("{{ messages|length }}{{ nothing|default('d') }}{{ ''|default('e', true) }}"
              "{{ 'a-b'|replace('-', '+') }}{{ [1,2]|join(',') }}{{ obj.a|first }}"
              "{{ obj.a|last }}{{ 'ab'|list }}{{ 12|string }}{{ '42'|int + 1 }}"),
            "3dea+b1,21True['a', 'b']1243");
  EXPECT_EQ(R("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}"
              "{{ messages|rejectattr('role', 'in', ['user', 'system'])|map(attribute='role')"
              "|join }}{{ [3,1,2]|sort }}{{ [1,1,2]|unique|list }}{{ obj|items|list|length }}"),
            "['hi']assistant[1, 2, 3][1, 2]3");
  EXPECT_EQ(R("{{ 'a\nb'|indent(2) }}|{{ [1,2,3]|sum }}{{ [3,1]|min }}{{ [3,1]|max }}"),
            "a\n  b|613");
}

TEST(JinjaRender, MethodsOfStringsAndDicts) {
  EXPECT_EQ(R("{{ ' x '.strip() }}{{ 'xxa'.lstrip('x') }}{{ 'a\n'.rstrip() }}"
              "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}"
              "{{ 'a,b'.split(',') }}{{ 'a b  c'.split() }}{{ 'ab'.upper() }}"
              "{{ 'a b'.title() }}{{ 'aa'.replace('a', 'b', 1) }}"),
            "xaaTrueTrue['a', 'b']['a', 'b', 'c']ABA Bba");
  EXPECT_EQ(R("{{ obj.get('b') }}{{ obj.get('zz', 'd') }}{{ obj.keys()|list }}"
              "{{ messages[1]['content'] }}{{ obj['s'][0] }}{{ 'héllo'[1:3] }}"),
            "1d['b', 'a', 's']hiéél");
}

TEST(JinjaRender, UndefinedBehavesAsJinja2) {
  EXPECT_EQ(R("[{{ nothing }}]{{ nothing|length }}{% for x in nothing %}x{% endfor %}"
              "{% if nothing %}t{% else %}f{% endif %}{{ obj.missing is defined }}"
              "{{ messages[0].tool_calls is defined }}"),
            "[]0fFalseFalse");
  // jinja2's default Undefined raises when an attribute of it is read or it
  // is used in arithmetic.
  EXPECT_EQ(R("{{ nothing.attr }}"),
            "ERROR: chat_template line 1: 'nothing' is undefined (reading its attribute 'attr')");
  EXPECT_EQ(R("\n{{ nothing + 1 }}"),
            "ERROR: chat_template line 2: 'nothing' is undefined (used with +)");
}

TEST(JinjaRender, RuntimeErrorsNameTheProblemAndLine) {
  EXPECT_EQ(R("a\nb\n{{ raise_exception('roles must alternate') }}"),
            "ERROR: chat_template line 3: raise_exception: roles must alternate");
  EXPECT_EQ(R("{{ 'a' + 1 }}"),
            "ERROR: chat_template line 1: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(R("{{ 1 < 'a' }}"),
            "ERROR: chat_template line 1: '<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(R("{% for x in 3 %}{% endfor %}"),
            "ERROR: chat_template line 1: 'int' object is not iterable");
  EXPECT_EQ(R("{% set x = 1 %}{% set x.y = 2 %}"),
            "ERROR: chat_template line 1: cannot assign attribute 'y' on 'x' (not a namespace)");
  EXPECT_EQ(R("{{ 1 // 0 }}"), "ERROR: chat_template line 1: integer division or modulo by zero");
  // The smallest int64: its negation and its quotient by -1 do not fit (x86 traps on the
  // latter); both are errors, and its remainder by -1 is 0 as in Python.
  EXPECT_EQ(R("{{ (-9223372036854775807 - 1) // -1 }}"),
            "ERROR: chat_template line 1: integer overflow");
  EXPECT_EQ(R("{{ -(-9223372036854775807 - 1) }}"),
            "ERROR: chat_template line 1: integer overflow");
  EXPECT_EQ(R("{{ (-9223372036854775807 - 1) % -1 }}"), "0");
  EXPECT_EQ(R("{{ nothing() }}"), "ERROR: chat_template line 1: 'nothing' is undefined (called)");
  EXPECT_EQ(R("{{ obj|tojson|int }}{{ nothing|tojson }}"),
            "ERROR: chat_template line 1: filter 'tojson': Object of type undefined is not JSON "
            "serializable");
}

TEST(JinjaRender, UnsupportedConstructsAreRefusedAtParseWithTheirLine) {
  EXPECT_EQ(R("x\n\n{% include 'other.jinja' %}"),
            "PARSE: chat_template line 3: unsupported tag 'include'");
  EXPECT_EQ(R("{% extends 'base' %}"), "PARSE: chat_template line 1: unsupported tag 'extends'");
  EXPECT_EQ(R("{% call foo() %}{% endcall %}"),
            "PARSE: chat_template line 1: unsupported tag 'call'");
  EXPECT_EQ(R("\n{{ x|wordwrap }}"), "PARSE: chat_template line 2: unsupported filter 'wordwrap'");
  EXPECT_EQ(R("{{ x is escaped }}"), "PARSE: chat_template line 1: unsupported test 'escaped'");
  EXPECT_EQ(R("{{ messages.append(1) }}"),
            "PARSE: chat_template line 1: unsupported method 'append'");
  EXPECT_EQ(R("{% for x in y recursive %}{% endfor %}"),
            "PARSE: chat_template line 1: unsupported construct 'recursive' loop");
  EXPECT_EQ(R("{% if x %}"),
            "PARSE: chat_template line 1: unexpected end of template (expected endif)");
  EXPECT_EQ(R("{{ 'open }}"), "PARSE: chat_template line 1: unclosed string literal");
  EXPECT_EQ(R("{% break %}"), "PARSE: chat_template line 1: 'break' outside a loop");
  EXPECT_EQ(R("a {{ x "), "PARSE: chat_template line 1: unclosed tag");
}

TEST(JinjaRender, HostileTemplatesHitLimitsInsteadOfHanging) {
  RenderLimits small;
  small.max_steps = 100000;
  small.max_output_bytes = 1000;
  EXPECT_EQ(
      R("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", small),
      "ERROR: chat_template line 1: the template ran more than 100000 steps");
  EXPECT_EQ(R("{% for i in range(500) %}xxxx{% endfor %}", small),
            "ERROR: chat_template line 1: the rendered text exceeds 1000 bytes");
  EXPECT_EQ(R("{{ range(10000000)|length }}"),
            "ERROR: chat_template line 1: range too big (more than 100000 items, as jinja2's "
            "sandbox)");
  EXPECT_EQ(R("{{ 'a' * 100000000000 }}"),
            "ERROR: chat_template line 1: repetition result too large");
  EXPECT_EQ(R("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}"),
            "ERROR: chat_template line 1: macro calls nested deeper than 64");
  std::string deep(5000, '(');
  EXPECT_EQ(R("{{ " + deep + "1" + std::string(5000, ')') + " }}"),
            "PARSE: chat_template line 1: expression nested too deeply");
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  EXPECT_EQ(R(blocks), "PARSE: chat_template line 1: blocks nested too deeply");
}

}  // namespace
}  // namespace tessera::jinja
