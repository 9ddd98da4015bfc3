#include "coordinator/api/tool_call_stream.h"

#include <random>

namespace tessera {

std::string NewToolCallId(ToolCallFormat format) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  if (format == ToolCallFormat::kMistral) {
    static constexpr char kAlnum[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id(9, 'a');
    for (char& c : id) c = kAlnum[rng() % (sizeof(kAlnum) - 1)];
    return id;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[rng() % 16];
  return id;
}

ToolCallOutput ParseToolCallOutput(ToolCallFormat format, std::string_view text) {
  ToolCallParse parse = ParseToolCalls(format, text, true);
  ToolCallOutput out;
  out.content = std::move(parse.content);
  for (PartialToolCall& c : parse.calls)
    out.calls.push_back({NewToolCallId(format), *c.name, std::move(c.arguments)});
  return out;
}

ToolCallStream::Update ToolCallStream::Diff(const ToolCallParse& parse) {
  Update u;
  // Content only grows; once calls began, content that the final parse
  // returns to (a malformed call) was partly sent as calls: send the rest.
  if (parse.content.size() > content_sent_) {
    u.content = parse.content.substr(content_sent_);
    content_sent_ = parse.content.size();
  }
  for (size_t k = 0; k < parse.calls.size(); ++k) {
    const PartialToolCall& c = parse.calls[k];
    if (k >= calls_.size()) {
      if (!c.name || k > calls_.size()) break;  // the header needs the name
      calls_.push_back({});
      ToolCallDelta d;
      d.index = static_cast<int>(k);
      d.id = NewToolCallId(format_);
      d.name = *c.name;
      d.arguments = c.arguments;
      calls_.back().arguments = c.arguments.size();
      u.calls.push_back(std::move(d));
      continue;
    }
    if (c.arguments.size() > calls_[k].arguments) {
      ToolCallDelta d;
      d.index = static_cast<int>(k);
      d.arguments = c.arguments.substr(calls_[k].arguments);
      calls_[k].arguments = c.arguments.size();
      u.calls.push_back(std::move(d));
    }
  }
  return u;
}

ToolCallStream::Update ToolCallStream::Push(std::string_view text) {
  text_.append(text);
  return Diff(ParseToolCalls(format_, text_, false));
}

ToolCallStream::Update ToolCallStream::Finish() {
  ToolCallParse parse = ParseToolCalls(format_, text_, true);
  if (parse.calls.empty() && !calls_.empty()) {
    // A call went out but the whole output does not hold valid calls (cut
    // off by max_tokens, malformed): the stream ends as it went.
    return {};
  }
  return Diff(parse);
}

}  // namespace tessera
