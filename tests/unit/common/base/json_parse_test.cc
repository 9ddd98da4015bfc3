// common/json_parse: the nesting bound, numbers beyond the double range, the
// JSON path in errors, ShowJsonValue's bounded quoting, and OrderedMember.
#include "common/base/json_parse.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera {
namespace {

using nlohmann::json;

std::string Nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(JsonParse, TheNestingBoundCountsTheDocumentAsLevelOne) {
  json j;
  JsonParseError e;
  EXPECT_TRUE(ParseJsonBounded(Nested(8), 8, &j, &e)) << e.message;
  EXPECT_FALSE(ParseJsonBounded(Nested(9), 8, &j, &e));
  EXPECT_NE(e.message.find("deeper than 8 levels"), std::string::npos) << e.message;
  // 60,000 levels: refused at level 65, never recursing further.
  EXPECT_FALSE(ParseJsonBounded(Nested(60000), kMaxRequestJsonDepth, &j, &e));
  EXPECT_NE(e.message.find("deeper than 64 levels"), std::string::npos) << e.message;
  EXPECT_LT(e.message.size(), 300u);
}

TEST(JsonParse, ErrorsNameThePathOfTheValueAtFault) {
  json j;
  JsonParseError e;
  ASSERT_FALSE(ParseJsonBounded(R"({"a":1,"user":1e400})", 64, &j, &e));
  EXPECT_EQ(e.path, "user");
  EXPECT_EQ(e.field, "user");
  EXPECT_EQ(e.message,
            "user: the number 1e400 is out of range (a JSON number here is a double: magnitude at "
            "most about 1.8e308)");
  ASSERT_FALSE(ParseJsonBounded(R"({"prompt":[1,2,-1e400]})", 64, &j, &e));
  EXPECT_EQ(e.path, "prompt[2]");
  EXPECT_EQ(e.field, "prompt");
  ASSERT_FALSE(ParseJsonBounded(R"({"m":[{"r":"u"},{"c":[[],[1e999]]}]})", 64, &j, &e));
  EXPECT_EQ(e.path, "m[1].c[1][0]");
  ASSERT_FALSE(ParseJsonBounded(R"({"p":{"q":[[[1]]]}})", 4, &j, &e));
  EXPECT_EQ(e.path, "p.q[0][0]");
  EXPECT_EQ(e.field, "p");
  // A number too long to quote is cut.
  ASSERT_FALSE(ParseJsonBounded("{\"x\":1" + std::string(5000, '0') + "}", 64, &j, &e));
  EXPECT_LT(e.message.size(), 160u) << e.message;
  EXPECT_EQ(e.field, "x");
}

// A member given twice is refused: parsers disagree on which copy counts.
TEST(JsonParse, AMemberGivenTwiceIsRefusedNamingIt) {
  json j;
  JsonParseError e;
  ASSERT_FALSE(ParseJsonBounded(R"({"prompt":"a","max_tokens":2,"prompt":"b"})", 64, &j, &e));
  EXPECT_EQ(e.message, "prompt: the member is given twice; give each member once");
  EXPECT_EQ(e.field, "prompt");
  ASSERT_FALSE(ParseJsonBounded(R"({"m":[{"role":"u","role":"s"}]})", 64, &j, &e));
  EXPECT_EQ(e.path, "m[0].role");
  EXPECT_EQ(e.field, "m");
  // The same name in different objects is fine.
  EXPECT_TRUE(ParseJsonBounded(R"({"a":{"x":1},"b":{"x":2},"c":[{"x":3},{"x":4}]})", 64, &j, &e))
      << e.message;
}

TEST(JsonParse, SyntaxErrorsGiveLineAndColumnWithoutLibraryText) {
  json j;
  JsonParseError e;
  ASSERT_FALSE(ParseJsonBounded("{\n  \"a\": tru }", 64, &j, &e));
  EXPECT_EQ(e.message.rfind("line 2, column ", 0), 0u) << e.message;
  EXPECT_EQ(e.message.find("json.exception"), std::string::npos) << e.message;
  EXPECT_TRUE(e.path.empty());
  auto s = ParseJsonBounded("[1,", 64, "body");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("body: line 1, column ", 0), 0u) << s.status().message();
  auto good = ParseJsonBounded(R"({"a":[1,2.5,"x",null,true]})", 64, "body");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ((*good)["a"][1].get<double>(), 2.5);
}

TEST(JsonParse, ShowJsonValueQuotesAPrefixOfAnyValue) {
  EXPECT_EQ(ShowJsonValue(json(7)), "7");
  EXPECT_EQ(ShowJsonValue(json("hot")), "\"hot\"");
  EXPECT_EQ(ShowJsonValue(json::parse(R"({"a":[1,2]})")), R"({"a":[1,2]})");
  const std::string long_text = ShowJsonValue(json(std::string(1 << 20, 'z')), 40);
  EXPECT_EQ(long_text.size(), 40u);
  EXPECT_EQ(long_text.substr(37), "...");
  json big = json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  const std::string shown = ShowJsonValue(big, 20);
  EXPECT_EQ(shown, "[0,1,2,3,4,5,6,7,...");
  // A deep value (built by hand, not parsed) is walked only as far as shown.
  json deep = json::array();
  for (int i = 0; i < 100; ++i) deep = json::array({deep});
  EXPECT_EQ(ShowJsonValue(deep, 10), "[[[[[[[...");
  // Invalid UTF-8 is replaced, never passed on.
  const std::string bad = ShowJsonValue(json(std::string("a\xff") + "b"));
  EXPECT_EQ(bad,
            "\"a\xEF\xBF\xBD"
            "b\"");
}

// A member as the text gives it, its objects' keys in the order written
// (nlohmann::json would sort them); null when absent or not an object.
TEST(JsonParse, OrderedMemberKeepsTheKeyOrderOfTheText) {
  const std::string text = R"({"b":1,"schema":{"zeta":{"y":1,"x":2},"alpha":[{"d":0,"c":0}]}})";
  const nlohmann::ordered_json m = OrderedMember(text, "schema");
  EXPECT_EQ(m.dump(), R"({"zeta":{"y":1,"x":2},"alpha":[{"d":0,"c":0}]})");
  EXPECT_EQ(json::parse(text)["schema"].dump(),
            R"({"alpha":[{"c":0,"d":0}],"zeta":{"x":2,"y":1}})");
  EXPECT_TRUE(OrderedMember(text, "missing").is_null());
  EXPECT_TRUE(OrderedMember("[1]", "schema").is_null());
}

}  // namespace
}  // namespace tessera
