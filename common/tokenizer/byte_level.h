// The GPT-2 byte-to-unicode map used by byte-level BPE (ByteLevel
// pre-tokenizer and decoder): every byte becomes one printable code point, so
// that BPE runs over text with no spaces or control characters.
// Source: openai/gpt-2 encoder.py `bytes_to_unicode` (bytes 33..126, 161..172
// and 174..255 map to themselves; the other 68 bytes map, in order, to
// U+0100 onwards).
//
// Thread-safety: immutable tables built on first use; safe from any thread.
#pragma once

#include <string>
#include <string_view>

namespace tessera {

// Appends the byte-level form of `bytes` (each byte as its mapped code point,
// UTF-8 encoded) to `out`.
void ByteLevelEncode(std::string_view bytes, std::string& out);

// The byte that code point `cp` stands for, or -1 when `cp` is not in the map.
int ByteLevelCharToByte(char32_t cp);

}  // namespace tessera
