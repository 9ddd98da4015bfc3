#include "common/tokenizer/chat_template.h"

namespace tessera {

const char* ChatFormatName(ChatFormat format) {
  switch (format) {
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kLlama2:
      return "llama2";
  }
  return "?";
}

namespace {

// The literal default system prompt of a ChatML Jinja template, e.g.
// {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}, with Jinja's \n
// escapes undone. Empty when the template has none.
std::string DefaultSystemPrompt(const std::string& jinja) {
  // The newline after "system" is either a Jinja escape (\n) or a real
  // newline, depending on how the template was serialised.
  size_t at = std::string::npos;
  for (const std::string& marker :
       {std::string("<|im_start|>system\\n"), std::string("<|im_start|>system\n")}) {
    at = jinja.find(marker);
    if (at != std::string::npos) {
      at += marker.size();
      break;
    }
  }
  if (at == std::string::npos) return "";
  // Only a literal: the next character must not start a Jinja expression.
  const size_t end = jinja.find("<|im_end|>", at);
  if (end == std::string::npos) return "";
  std::string raw = jinja.substr(at, end - at);
  if (raw.find('\'') != std::string::npos || raw.find("{{") != std::string::npos) return "";
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += raw[i];
    }
  }
  return out;
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Detect(const std::string& jinja) {
  ChatTemplate t;
  if (jinja.find("<|im_start|>") != std::string::npos) {
    t.format_ = ChatFormat::kChatML;
    t.default_system_ = DefaultSystemPrompt(jinja);
  } else if (jinja.find("<|start_header_id|>") != std::string::npos) {
    t.format_ = ChatFormat::kLlama3;
  } else if (jinja.find("[INST]") != std::string::npos) {
    t.format_ = ChatFormat::kLlama2;
  } else {
    return Unimplemented(std::string(jinja.empty() ? "the model has no chat_template"
                                                   : "unrecognised chat_template") +
                         " (supported: chatml, llama3, llama2; set one explicitly)");
  }
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::FromName(const std::string& name) {
  ChatTemplate t;
  if (name == "chatml") {
    t.format_ = ChatFormat::kChatML;
  } else if (name == "llama3") {
    t.format_ = ChatFormat::kLlama3;
  } else if (name == "llama2") {
    t.format_ = ChatFormat::kLlama2;
  } else {
    return InvalidArgument("unknown chat template '" + name + "' (valid: chatml, llama3, llama2)");
  }
  return t;
}

StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      return InvalidArgument("messages[" + std::to_string(i) + "].role: '" + r +
                             "' is not one of system, user, assistant");
  }
  std::string out;
  switch (format_) {
    case ChatFormat::kChatML:
      if (!default_system_.empty() && (messages.empty() || messages[0].role != "system"))
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      for (const ChatMessage& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::kLlama3:
      out += "<|begin_of_text|>";
      for (const ChatMessage& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::kLlama2: {
      std::string system;
      size_t i = 0;
      if (!messages.empty() && messages[0].role == "system") {
        system = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n";
        i = 1;
      }
      for (; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
          out += "<s>[INST] " + system + m.content + " [/INST]";
          system.clear();
        } else if (m.role == "assistant") {
          out += " " + m.content + "</s>";
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace tessera
