// Incremental scanning of the JSON a model writes for a tool call, shared by
// the family parsers (tool_call_parsers.h). The text may stop anywhere (a
// stream's output so far): a value is complete, partial (the text ends
// inside it) or malformed (no continuation makes it JSON). The scan is
// lenient inside arrays and objects (it matches brackets and strings);
// ParseToolCalls validates a complete call's arguments with nlohmann/json.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

enum class ScanState { kComplete, kPartial, kMalformed };

// The first position at or after `pos` that is not JSON whitespace.
size_t SkipJsonSpace(std::string_view s, size_t pos);

// The JSON value at `pos` (after whitespace): kComplete with `end` one past
// it; kPartial when the text ends first; kMalformed otherwise.
struct ValueScan {
  ScanState state = ScanState::kPartial;
  size_t end = 0;
};
ValueScan ScanJsonValue(std::string_view s, size_t pos);

// A call object {"name": string, <args key>: value, ...} as far as the text
// goes. `arguments` is the raw text of the arguments value: while partial,
// the text from its start to the end of `s` (it only grows as `s` grows).
struct PartialToolCall {
  std::optional<std::string> name;  // once its string is complete
  std::string arguments;
  bool arguments_seen = false;      // the arguments value has started
  bool arguments_complete = false;  // ... and ended
};
struct CallScan {
  ScanState state = ScanState::kPartial;
  size_t end = 0;  // kComplete: one past the closing brace
  PartialToolCall call;
};
// `args_keys`: the keys that hold the arguments ("arguments", "parameters").
CallScan ScanCallObject(std::string_view s, size_t pos,
                        std::initializer_list<std::string_view> args_keys);

// The length of the longest suffix of `text` that is a proper prefix of
// `marker` (text a stream holds back: it may be the marker's start).
size_t MarkerPrefixSuffix(std::string_view text, std::string_view marker);

}  // namespace tessera
