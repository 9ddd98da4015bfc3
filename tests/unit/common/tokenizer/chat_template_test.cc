#include "common/tokenizer/chat_template.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

// SmolLM2-Instruct's template (abridged to its structure): a default system
// prompt, then ChatML turns.
const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplate, ChatMLWithDefaultSystemPrompt) {
  auto t = ChatTemplate::Detect(kSmolTemplate);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->format(), ChatFormat::kChatML);
  auto r = t->Render({{"user", "Hi"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto r2 = t->Render({{"system", "Be brief."}, {"user", "Hi"}});
  EXPECT_EQ(*r2,
            "<|im_start|>system\nBe "
            "brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatMLTemplateWithRealNewlines) {
  // GGUF metadata carries the template with real newlines instead of \n escapes.
  auto t = ChatTemplate::Detect(
      "{% if loop.first %}{{ '<|im_start|>system\nBe nice<|im_end|>\n' }}{% endif "
      "%}{{'<|im_start|>' }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render({{"user", "Hi"}}),
            "<|im_start|>system\nBe "
            "nice<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3AndLlama2) {
  auto l3 = ChatTemplate::Detect("{{ '<|start_header_id|>' + message['role'] }}");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(
      *l3->Render({{"user", "Hi"}}),
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>"
      "assistant<|end_header_id|>\n\n");
  auto l2 = ChatTemplate::Detect("{{ bos_token + '[INST] ' + content + ' [/INST]' }}");
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(*l2->Render({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "More"}}),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST] Yo</s><s>[INST] More [/INST]");
}

TEST(ChatTemplate, ErrorsNameWhatIsWrong) {
  auto none = ChatTemplate::Detect("{{ messages }}");
  EXPECT_EQ(none.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(none.status().message().find("chatml, llama3, llama2"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::FromName("vicuna").ok());
  auto t = ChatTemplate::FromName("chatml");
  auto bad = t->Render({{"user", "a"}, {"robot", "b"}});
  EXPECT_NE(bad.status().message().find("messages[1].role"), std::string::npos);
}

}  // namespace
}  // namespace tessera
