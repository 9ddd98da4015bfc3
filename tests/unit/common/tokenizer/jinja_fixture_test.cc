// The public chat templates of tests/fixtures/chat_templates/ rendered by
// Tessera's interpreter must equal transformers' rendering, recorded by
// tools/record_chat_templates.py into expected.json (text, or the error a
// template raises).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "common/tokenizer/jinja_parser.h"
#include "common/tokenizer/jinja_render.h"
#include "support/test_util.h"

namespace tessera::jinja {
namespace {

using ordered_json = nlohmann::ordered_json;

TEST(JinjaFixtures, PublicTemplatesRenderAsTransformers) {
  const auto cases = ordered_json::parse(::tessera::testing::ReadFileOrDie(
      ::tessera::testing::FixturePath("chat_templates/expected.json")));
  ASSERT_GE(cases.size(), 30u);
  std::set<std::string> templates;
  int errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"].get<std::string>();
    const std::string what = name + "/" + c["case"].get<std::string>();
    templates.insert(name);
    const std::string source = ::tessera::testing::ReadFileOrDie(
        ::tessera::testing::FixturePath("chat_templates/" + name + ".jinja"));
    auto tpl = Parse(source);
    ASSERT_TRUE(tpl.ok()) << what << ": " << tpl.status().ToString();
    Dict ctx;
    ctx.Set("messages", Value::FromJson(c["messages"]));
    ctx.Set("tools", Value::FromJson(c["tools"]));
    ctx.Set("documents", Value::None());
    ctx.Set("add_generation_prompt", Value::Bool(c["add_generation_prompt"].get<bool>()));
    ctx.Set("bos_token", Value::String(c["bos_token"].get<std::string>()));
    ctx.Set("eos_token", Value::String(c["eos_token"].get<std::string>()));
    for (auto it = c["extra"].begin(); it != c["extra"].end(); ++it)
      ctx.Set(it.key(), Value::FromJson(*it));
    auto out = Render(*tpl, ctx);
    if (c.contains("error")) {
      ++errors;
      ASSERT_FALSE(out.ok()) << what << " rendered: " << *out;
      EXPECT_NE(out.status().message().find("raise_exception: " + c["error"].get<std::string>()),
                std::string::npos)
          << what << ": " << out.status().ToString();
      continue;
    }
    ASSERT_TRUE(out.ok()) << what << ": " << out.status().ToString();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << what;
  }
  EXPECT_EQ(templates.size(), 10u);
  EXPECT_GE(errors, 3);
}

}  // namespace
}  // namespace tessera::jinja
