// Tool calls out of a chat choice's generated text: the whole output's
// (ParseToolCallOutput) and a stream's deltas (ToolCallStream), in a model
// family's format (tool_call_parsers.h). A streamed choice's content deltas
// and tool-call deltas join into exactly the whole output's content and
// calls: the stream sends the differences of the parser's growing view, and
// its end applies the whole-output parse (which falls back to all content
// when a call is malformed or cut off).
//
// Thread-safety: ParseToolCallOutput and NewToolCallId from any thread; a
// ToolCallStream is used by one thread at a time (the exchange's mutex).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/api/openai_api.h"
#include "coordinator/api/tool_call_parsers.h"

namespace tessera {

// A fresh call id: "call_" and 24 random hex digits; for kMistral 9 random
// letters and digits (its template refuses other ids in the history).
std::string NewToolCallId(ToolCallFormat format);

// The whole output: its content (text before the calls) and its calls with
// fresh ids; all content and no calls when it holds none or a malformed one.
struct ToolCallOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ToolCallOutput ParseToolCallOutput(ToolCallFormat format, std::string_view text);

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}

  // What a chunk sends: content text (empty: none) and tool-call deltas.
  struct Update {
    std::string content;
    std::vector<ToolCallDelta> calls;
    bool empty() const { return content.empty() && calls.empty(); }
  };
  // `text`: the next piece of the output.
  Update Push(std::string_view text);
  // The output ended: what the whole-output parse adds to what was sent.
  Update Finish();
  // A call's first delta went out (the finish_reason is then "tool_calls").
  bool called() const { return !calls_.empty(); }

 private:
  Update Diff(const ToolCallParse& parse);

  const ToolCallFormat format_;
  std::string text_;         // the output so far
  size_t content_sent_ = 0;  // bytes of content sent
  struct SentCall {
    size_t arguments = 0;  // bytes of arguments sent
  };
  std::vector<SentCall> calls_;  // calls whose first delta went out
};

}  // namespace tessera
