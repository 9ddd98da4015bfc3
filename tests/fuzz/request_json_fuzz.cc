// libFuzzer harness: JSON request bodies, deep nesting included.
//
// Input: [mode][depth low][depth high][bytes...]. The bytes are placed, as
// raw JSON text, into one field of a completions or chat request chosen by
// `mode`, wrapped in `depth` (up to 65,535) nested arrays or objects, so
// libFuzzer reaches the nesting that once overflowed the stack of the JSON
// serializer (issue #14: 60,000 levels in `prompt`). Each body goes through
// ParseJsonBounded, ParseCompletionRequest and ParseChatCompletionRequest,
// and every error message is quoted in the reply: the harness fails when a
// parse throws, when an error's message is empty or longer than a reply
// should quote, or when a body nested past the bound is accepted.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/json_parse.h"
#include "coordinator/api/openai_api.h"
#include "fuzz_util.h"

namespace {

using namespace tessera;

const char* const kFields[] = {"prompt", "max_tokens",  "stop",  "messages",   "user",
                               "seed",   "temperature", "top_p", "logit_bias", "tools"};

std::string Wrap(std::string_view inner, int depth, bool objects) {
  std::string s;
  s.reserve(inner.size() + static_cast<size_t>(depth) * 6);
  for (int i = 0; i < depth; ++i) s += objects ? "{\"a\":" : "[";
  s += inner;
  for (int i = 0; i < depth; ++i) s += objects ? '}' : ']';
  return s;
}

template <typename R>
void Check(const R& r, std::string_view body) {
  if (r.ok()) return;
  const ApiError& e = r.error();
  if (e.message.empty()) fuzz::Fail("an error without a message for: " + std::string(body));
  // Messages quote values cut to a few dozen characters and paths cut to
  // about 120: never the request itself.
  if (e.message.size() > 600)
    fuzz::Fail("an error message of " + std::to_string(e.message.size()) + " bytes");
  (void)e.ToJson();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t mode = data[0];
  const int depth = data[1] | (data[2] << 8);
  const std::string_view raw(reinterpret_cast<const char*>(data + 3), size - 3);
  const bool objects = mode & 0x80;
  const char* field = kFields[(mode & 0x7f) % (sizeof(kFields) / sizeof(kFields[0]))];
  const std::string value = Wrap(raw.empty() ? std::string_view("1") : raw, depth, objects);
  const std::string body =
      std::string("{\"model\":\"m\",\"max_tokens\":2,\"") + field + "\":" + value +
      (std::string_view(field) == "messages"
           ? std::string("}")
           : std::string(",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}"));
  nlohmann::json parsed;
  JsonParseError error;
  const bool ok = ParseJsonBounded(body, kMaxRequestJsonDepth, &parsed, &error);
  if (ok && depth + 1 > kMaxRequestJsonDepth) fuzz::Fail("a body nested past the bound parsed");
  if (ok) (void)ShowJsonValue(parsed);
  if (!ok && error.message.empty()) fuzz::Fail("a parse error without a message");
  Check(ParseCompletionRequest(body), body);
  Check(ParseChatCompletionRequest(body), body);
  // The raw bytes alone, as a whole body.
  Check(ParseCompletionRequest(raw), raw);
  Check(ParseChatCompletionRequest(raw), raw);
  return 0;
}
