// libFuzzer harness: tokenizer.json loading and encoding.
//
// Input: a mode byte, then
//   even: a tokenizer.json; when it loads, it encodes and decodes a few
//         fixed texts;
//   odd:  text to encode with the fixture tokenizers (byte-level GPT-2 and
//         Llama-3, Metaspace Llama-2), then decode again.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "fuzz_util.h"

namespace {

using tessera::Tokenizer;

const std::vector<std::unique_ptr<Tokenizer>>& Fixtures() {
  static const std::vector<std::unique_ptr<Tokenizer>> all = [] {
    std::vector<std::unique_ptr<Tokenizer>> v;
    for (const char* name :
         {"bytelevel_gpt2", "bytelevel_llama3", "metaspace_llama2", "metaspace_pretok"}) {
      auto t = Tokenizer::Load(std::string(TESSERA_FIXTURES_DIR) + "/tokenizers/" + name);
      if (!t.ok())
        tessera::fuzz::Fail("fixture tokenizer " + std::string(name) + ": " +
                            t.status().ToString());
      v.push_back(std::move(*t));
    }
    return v;
  }();
  return all;
}

void Exercise(const Tokenizer& t, std::string_view text) {
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = t.Encode(text, special);
    for (int32_t id : ids) {
      if (id < 0 || id >= t.vocab_size())
        tessera::fuzz::Fail("Encode produced id " + std::to_string(id) + " outside [0, " +
                            std::to_string(t.vocab_size()) + ")");
    }
    (void)t.Decode(ids, special);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    const std::string dir = tessera::fuzz::ScratchDir() + "/tokenizer";
    static const bool made = [&] { return std::system(("mkdir -p '" + dir + "'").c_str()) == 0; }();
    if (!made) tessera::fuzz::Fail("cannot make " + dir);
    tessera::fuzz::WriteFile(dir + "/tokenizer.json", rest);
    auto t = Tokenizer::Load(dir);
    if (!t.ok()) return 0;
    for (std::string_view text :
         {"Hello, world!", " a  b\n\tc", "\xc3\xa9t\xc3\xa9 \xe2\x82\xac 123",
          "<s>[INST] hi [/INST]</s>", "\xff\xfe invalid"}) {
      Exercise(**t, text);
    }
    std::vector<int32_t> ids;
    for (int32_t i = -2; i < 300; ++i) ids.push_back(i);
    (void)(*t)->Decode(ids, false);
    return 0;
  }
  for (const auto& t : Fixtures()) Exercise(*t, rest);
  return 0;
}
