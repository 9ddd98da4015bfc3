#include "common/tokenizer/chat_template.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

// SmolLM2-Instruct's template: a default system prompt, then ChatML turns.
const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplate, JinjaTemplateRendersWithItsDefaultSystemPrompt) {
  auto t = ChatTemplate::FromJinja(kSmolTemplate, "", "<|im_end|>");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->is_jinja());
  EXPECT_FALSE(t->add_special_tokens());
  auto r = t->Render({{"user", "Hi"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto r2 = t->Render({{"system", "Be brief."}, {"user", "Hi"}}, false);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(*r2, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, ContentIsNeverTemplateCode) {
  auto t = ChatTemplate::FromJinja("{{ messages[0].content }}", "", "");
  ASSERT_TRUE(t.ok());
  auto r = t->Render({{"user", "{{ raise_exception('x') }}{% for a in b %}"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "{{ raise_exception('x') }}{% for a in b %}");
}

TEST(ChatTemplate, BuiltinsForTheConfigOverride) {
  auto ml = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(ml.ok());
  EXPECT_TRUE(ml->add_special_tokens());
  EXPECT_EQ(*ml->Render({{"user", "Hi"}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*ml->Render({{"user", "Hi"}}, false), "<|im_start|>user\nHi<|im_end|>\n");
  auto l3 = ChatTemplate::FromName("llama3");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(
      *l3->Render({{"user", "Hi"}}),
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>"
      "assistant<|end_header_id|>\n\n");
  auto l2 = ChatTemplate::FromName("llama2");
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(*l2->Render({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "More"}}),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST] Yo</s><s>[INST] More [/INST]");
}

TEST(ChatTemplate, ErrorsNameWhatIsWrong) {
  auto none = ChatTemplate::FromJinja("", "", "");
  EXPECT_EQ(none.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(none.status().message().find("model.chat_template"), std::string::npos);
  auto unsupported = ChatTemplate::FromJinja("a\n{% include 'x' %}", "", "");
  EXPECT_EQ(unsupported.status().message(), "chat_template line 2: unsupported tag 'include'");
  EXPECT_FALSE(ChatTemplate::FromName("vicuna").ok());
  auto t = ChatTemplate::FromName("chatml");
  auto bad = t->Render({{"user", "a"}, {"robot", "b"}});
  EXPECT_NE(bad.status().message().find("messages[1].role"), std::string::npos);
  auto raising = ChatTemplate::FromJinja(
      "{% if messages[0].role != 'user' %}\n{{ raise_exception('first must be user') }}{% endif %}",
      "", "");
  ASSERT_TRUE(raising.ok());
  auto r = raising->Render({{"assistant", "x"}});
  EXPECT_EQ(r.status().message(), "chat_template line 2: raise_exception: first must be user");
}

}  // namespace
}  // namespace tessera
