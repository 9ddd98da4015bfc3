// A real coordinator + workers serving a model whose tokenizer_config.json
// carries its own Jinja chat template: /v1/chat/completions renders it (the
// prompt is the template's text, tokenized as transformers would), a
// conversation the template refuses with raise_exception gets a 400 naming the
// problem, and the daemon keeps serving.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "support/daemons_fixture.h"

namespace tessera {
namespace {

using json = nlohmann::json;

constexpr const char* kTemplate =
    "{%- for m in messages %}\n"
    "  {%- if m.role == 'system' and not loop.first %}\n"
    "    {{- raise_exception('the system message must come first') }}\n"
    "  {%- endif %}\n"
    "  {{- bos_token if loop.first }}[{{ m.role | upper }}] {{ m.content | trim }}\n"
    "{% endfor %}\n"
    "{%- if add_generation_prompt %}[ASSISTANT]{% endif %}";

class JinjaTemplateDaemons : public Daemons {
 protected:
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.model_toml = "";  // no override: the checkpoint's own template
    return o;
  }
  std::string ModelPath() const override {
    namespace fs = std::filesystem;
    const fs::path dst = fs::path(dir_) / "llama_gqa_f32";
    fs::create_directories(dst);
    const fs::path src = ::tessera::testing::FixturePath("models/llama_gqa_f32");
    for (const auto& e : fs::directory_iterator(src))
      fs::copy_file(e.path(), dst / e.path().filename(), fs::copy_options::overwrite_existing);
    json cfg =
        json::parse(::tessera::testing::ReadFileOrDie((dst / "tokenizer_config.json").string()));
    cfg["chat_template"] = kTemplate;
    std::ofstream(dst / "tokenizer_config.json") << cfg.dump(2);
    return dst.string();
  }
};

TEST_F(JinjaTemplateDaemons, ServesTheModelsTemplateAndRefusesWhatItRaisesOn) {
  json good = {{"model", "llama_gqa_f32"},
               {"messages",
                {{{"role", "system"}, {"content", "  be brief "}},
                 {{"role", "user"},
                  {"content",
                   [] {
                     return json::array({{{"type", "text"}, {"text", "the cat {{ 7 * 7 }}"}}});
                   }()}}}},
               {"max_tokens", 3},
               {"temperature", 0},
               {"ignore_eos", true}};
  auto r = HttpCall(port_, "POST", "/v1/chat/completions", good.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  // The prompt is exactly the template's rendering (user text is data: the
  // "{{ 7 * 7 }}" stays literal), encoded without added special tokens.
  auto tok = Tokenizer::Load(dir_ + "/llama_gqa_f32");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::string text =
      "<|begin_of_text|>[SYSTEM] be brief\n[USER] the cat {{ 7 * 7 }}\n[ASSISTANT]";
  const auto ids = (*tok)->Encode(text, false);
  const json body = json::parse(r.body);
  EXPECT_EQ(body["usage"]["prompt_tokens"].get<size_t>(), ids.size()) << r.body;
  EXPECT_EQ(body["usage"]["completion_tokens"].get<int>(), 3) << r.body;

  json bad = {{"model", "llama_gqa_f32"},
              {"messages",
               {{{"role", "user"}, {"content", "hi"}}, {{"role", "system"}, {"content", "late"}}}}};
  auto e = HttpCall(port_, "POST", "/v1/chat/completions", bad.dump());
  EXPECT_EQ(e.status, 400) << e.body;
  const json err = json::parse(e.body, nullptr, false);
  ASSERT_TRUE(err.is_object() && err.contains("error")) << e.body;
  EXPECT_EQ(err["error"]["message"].get<std::string>(),
            "chat_template line 3: raise_exception: the system message must come first");
  EXPECT_EQ(err["error"]["code"], "chat_template_error") << e.body;
  EXPECT_EQ(err["error"]["param"], "messages") << e.body;

  // Still serving.
  auto again = HttpCall(port_, "POST", "/v1/chat/completions", good.dump());
  EXPECT_EQ(again.status, 200) << again.body;
}

}  // namespace
}  // namespace tessera
