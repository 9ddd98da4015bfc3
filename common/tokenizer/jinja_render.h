// Renders a parsed chat template (jinja_parser.h) against a context, as
// transformers' ImmutableSandboxedEnvironment does: globals raise_exception,
// strftime_now, namespace, dict, range; no autoescape; lists and dicts are
// immutable (only namespace attributes are assigned).
//
// Values from the context (message content) are data only: nothing rendered
// is parsed again, so user text can never act as template code.
// Limits bound a hostile template or conversation: output bytes, steps (loop
// iterations + calls + nodes run) and macro call depth.
//
// Errors: kInvalidArgument "chat_template line N: <problem>" for a runtime
// error (type error, undefined value used, a limit hit); for
// raise_exception(msg) the message is "chat_template line N: raise_exception:
// <msg>".
// Thread-safety: Render is reentrant; a Template may be rendered from many
// threads at once (each render builds its own values).
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"
#include "common/tokenizer/jinja_parser.h"
#include "common/tokenizer/jinja_value.h"

namespace tessera::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // 16 MiB of rendered text
  int64_t max_steps = 10'000'000;              // nodes + loop iterations + calls
  int max_call_depth = 64;                     // macro recursion
};

// `context`: the template's variables (messages, add_generation_prompt, ...).
StatusOr<std::string> Render(const Template& tpl, const Dict& context,
                             const RenderLimits& limits = {});

}  // namespace tessera::jinja
