// Helpers shared by the libFuzzer harnesses in tests/fuzz: a private scratch
// file per process, and a hard failure that libFuzzer records as a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

namespace tessera::fuzz {

// A scratch directory for this fuzzing process (under TMPDIR or /tmp),
// created once.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d =
        std::string(tmp && *tmp ? tmp : "/tmp") + "/tessera-fuzz-" + std::to_string(getpid());
    std::string cmd = "mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  return dir;
}

// Writes `bytes` to `path`, replacing it.
inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();
}

// An invariant the code under test broke: print it and crash, so that
// libFuzzer saves the input.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Splits "[u16 little-endian length][bytes]..." into frames; a short last
// length takes what is left.
template <class Fn>
void ForEachFrame(const uint8_t* data, size_t size, Fn&& fn) {
  size_t i = 0;
  while (i + 2 <= size) {
    size_t len = static_cast<size_t>(data[i]) | (static_cast<size_t>(data[i + 1]) << 8);
    i += 2;
    if (len > size - i) len = size - i;
    fn(std::string_view(reinterpret_cast<const char*>(data + i), len));
    i += len;
  }
}

}  // namespace tessera::fuzz
