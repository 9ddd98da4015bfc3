#include "coordinator/api/token_texts.h"

namespace tessera {

std::vector<std::string> IncrementalTokenTexts(const Tokenizer& tokenizer,
                                               const std::vector<int32_t>& ids,
                                               const std::string& text) {
  TokenTextStream stream(tokenizer);
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int32_t id : ids) out.push_back(stream.Push(id));
  if (!out.empty()) out.back() += stream.Flush();
  size_t at = 0;
  for (std::string& t : out) {
    const size_t left = text.size() - std::min(at, text.size());
    if (t.size() > left) t.resize(left);
    at += t.size();
  }
  return out;
}

TokenTextStream::TokenTextStream(const Tokenizer& tokenizer)
    : decoder_(std::make_unique<IncrementalDecoder>(tokenizer, true)) {}

std::string TokenTextStream::Push(int32_t id) { return decoder_->Push(id); }

std::string TokenTextStream::Flush() { return decoder_->Flush(); }

}  // namespace tessera
