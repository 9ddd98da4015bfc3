#include "common/tokenizer/chat_template.h"

#include "common/tokenizer/jinja_render.h"

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

StatusOr<ChatTemplate> ChatTemplate::FromJinja(const std::string& jinja, std::string bos_token,
                                               std::string eos_token) {
  if (jinja.empty())
    return Unimplemented(
        "the model has no chat_template; set model.chat_template (chatml, llama3, llama2)");
  TESSERA_ASSIGN_OR_RETURN(jinja::Template tpl, jinja::Parse(jinja));
  ChatTemplate t;
  t.jinja_ = std::make_shared<const jinja::Template>(std::move(tpl));
  t.source_ = std::make_shared<const std::string>(jinja);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
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

bool ChatTemplate::references_tools() const {
  return source_ && source_->find("tools") != std::string::npos;
}

const std::string& ChatTemplate::source() const {
  static const std::string kNone;
  return source_ ? *source_ : kNone;
}

StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt,
                                           const nlohmann::ordered_json* tools) const {
  if (jinja_) {
    // What transformers' render_jinja_template passes (documents are None).
    jinja::List msgs;
    for (const ChatMessage& m : messages) {
      jinja::Dict d;
      d.items = {
          {"role", jinja::Value::String(m.role)},
          {"content", m.content_null ? jinja::Value::None() : jinja::Value::String(m.content)}};
      if (m.extra.is_object())
        for (const auto& [key, value] : m.extra.items())
          d.items.emplace_back(key, jinja::Value::FromJson(value));
      msgs.push_back(jinja::Value::MakeDict(std::move(d)));
    }
    jinja::Dict ctx;
    ctx.items = {{"messages", jinja::Value::MakeList(std::move(msgs))},
                 {"tools", tools && !tools->is_null() ? jinja::Value::FromJson(*tools)
                                                      : jinja::Value::None()},
                 {"documents", jinja::Value::None()},
                 {"add_generation_prompt", jinja::Value::Bool(add_generation_prompt)},
                 {"bos_token", jinja::Value::String(bos_token_)},
                 {"eos_token", jinja::Value::String(eos_token_)}};
    return jinja::Render(*jinja_, ctx);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      return InvalidArgument("messages[" + std::to_string(i) + "].role: '" + r +
                             "' is not one of system, user, assistant");
  }
  std::string out;
  switch (format_) {
    case ChatFormat::kChatML:
      for (const ChatMessage& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::kLlama3:
      out += "<|begin_of_text|>";
      for (const ChatMessage& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
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
