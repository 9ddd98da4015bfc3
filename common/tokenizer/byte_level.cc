#include "common/tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "common/base/utf8.h"

namespace tessera {

namespace {

struct ByteLevelTables {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cp_to_byte{};  // every mapped code point is < 0x144

  ByteLevelTables() {
    cp_to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    }
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(byte_to_utf8[b], byte_to_cp[b]);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* kTables = new ByteLevelTables();
  return *kTables;
}

}  // namespace

void ByteLevelEncode(std::string_view bytes, std::string& out) {
  const auto& t = Tables();
  for (char c : bytes) out.append(t.byte_to_utf8[static_cast<unsigned char>(c)]);
}

int ByteLevelCharToByte(char32_t cp) {
  if (cp >= 512) return -1;
  return Tables().cp_to_byte[cp];
}

}  // namespace tessera
