// Built-in chat templates, chosen by matching the Jinja `chat_template` of a
// model's tokenizer_config.json. Tessera does not run Jinja: it recognises the
// three families in use and renders them in C++.
//  - kChatML (SmolLM2, Qwen2): "<|im_start|>role\ncontent<|im_end|>\n",
//    generation prompt "<|im_start|>assistant\n". A default system message
//    written into the template (SmolLM2 has one) is inserted when the
//    conversation has none, as the Jinja template does.
//  - kLlama3: "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>",
//    after "<|begin_of_text|>", generation prompt for "assistant".
//  - kLlama2 (Llama-2 / Mistral): "<s>[INST] user [/INST] answer</s>"; a
//    system message goes inside the first [INST] in <<SYS>> markers.
//
// Thread-safety: ChatTemplate is an immutable value.
#pragma once

#include <string>
#include <vector>

#include "common/base/status.h"

namespace tessera {

enum class ChatFormat { kChatML, kLlama3, kLlama2 };
const char* ChatFormatName(ChatFormat format);  // "chatml", "llama3", "llama2"

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // Detects the family of a Jinja chat template. Errors: kUnimplemented when
  // the template is empty or matches none, listing the supported families.
  static StatusOr<ChatTemplate> Detect(const std::string& jinja);
  // By name ("chatml", "llama3", "llama2"), for a config override.
  // Errors: kInvalidArgument listing the valid names.
  static StatusOr<ChatTemplate> FromName(const std::string& name);

  ChatFormat format() const { return format_; }
  // Renders the conversation, ending with the assistant generation prompt.
  // The text contains special-token strings (e.g. "<|im_start|>"); encode it
  // without adding BOS for kLlama3/kLlama2, which write their own.
  // Errors: kInvalidArgument naming the message index for an unknown role.
  StatusOr<std::string> Render(const std::vector<ChatMessage>& messages) const;

 private:
  ChatFormat format_ = ChatFormat::kChatML;
  std::string default_system_;
};

}  // namespace tessera
