// A model's chat template. When the checkpoint has a Jinja `chat_template`
// (tokenizer_config.json or chat_template.jinja), FromJinja parses it when the
// model loads and Render runs it with the small Jinja interpreter of
// jinja_{lexer,parser,render,builtins,value}.h, as transformers'
// apply_chat_template does (context: messages, add_generation_prompt,
// bos_token, eos_token, tools (the request's, else None), documents=None, and the globals
// raise_exception, strftime_now, namespace, dict, range). A template using a
// construct the interpreter lacks is refused at load, naming it and its line.
//
// Three built-in formats remain, for a model without a template and for the
// explicit `model.chat_template` config override (FromName):
//  - kChatML (SmolLM2, Qwen2): "<|im_start|>role\ncontent<|im_end|>\n",
//    generation prompt "<|im_start|>assistant\n".
//  - kLlama3: "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>",
//    after "<|begin_of_text|>", generation prompt for "assistant".
//  - kLlama2 (Llama-2 / Mistral): "<s>[INST] user [/INST] answer</s>"; a
//    system message goes inside the first [INST] in <<SYS>> markers.
//
// Thread-safety: ChatTemplate is an immutable value; Render may run from many
// threads at once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/tokenizer/jinja_parser.h"

namespace tessera {

enum class ChatFormat { kChatML, kLlama3, kLlama2 };
const char* ChatFormatName(ChatFormat format);  // "chatml", "llama3", "llama2"

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // Passed as None to a Jinja template (an assistant message that only
  // calls tools).
  bool content_null = false;
  // Further keys of the message's dict for a Jinja template, in order
  // (tool_calls, tool_call_id, name); null or an object. Keys absent here are
  // absent in the dict (templates test `'tool_calls' in message`).
  nlohmann::ordered_json extra = nullptr;
};

class ChatTemplate {
 public:
  // Parses a Jinja chat template; bos_token/eos_token are passed to it as
  // transformers does. Errors: kInvalidArgument "chat_template line N: ..."
  // for a syntax error or an unsupported construct (tag, filter, test,
  // method); kUnimplemented when `jinja` is empty.
  static StatusOr<ChatTemplate> FromJinja(const std::string& jinja, std::string bos_token,
                                          std::string eos_token);
  // By name ("chatml", "llama3", "llama2"), for a config override.
  // Errors: kInvalidArgument listing the valid names.
  static StatusOr<ChatTemplate> FromName(const std::string& name);

  bool is_jinja() const { return jinja_ != nullptr; }
  // The built-in format; meaningful only when !is_jinja().
  ChatFormat format() const { return format_; }
  // Whether the rendered text is encoded with the tokenizer's special tokens
  // added: false for a Jinja template (it writes its own, as
  // apply_chat_template encodes with add_special_tokens=False) and for
  // kLlama3/kLlama2; true for kChatML.
  bool add_special_tokens() const { return !is_jinja() && format_ == ChatFormat::kChatML; }
  // Renders the conversation; with add_generation_prompt it ends with the
  // assistant generation prompt. The text contains special-token strings.
  // Errors: kInvalidArgument naming the problem: an unknown role (built-ins),
  // or a template runtime error "chat_template line N: ..." (raise_exception's
  // message, a type error, a render limit).
  // `tools`: the request's tool list (OpenAI's shape, in the request's key
  // order) passed as the template's `tools`; nullptr or null: None. Built-in
  // formats render no tools (callers check references_tools()).
  StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt = true,
                               const nlohmann::ordered_json* tools = nullptr) const;
  // Whether a Jinja template's source names `tools` (it can render them);
  // false for the built-in formats.
  bool references_tools() const;
  // The Jinja source ("" for a built-in format).
  const std::string& source() const;

 private:
  ChatFormat format_ = ChatFormat::kChatML;
  std::shared_ptr<const jinja::Template> jinja_;  // immutable, shared by copies
  std::shared_ptr<const std::string> source_;     // the Jinja source; null for built-ins
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace tessera
