// Where the grammar engine's libraries are: the config keys
// structured_output.llguidance_library and structured_output.python_library
// (common/config/daemon_config.h) and their defaults.
//
// Thread-safety: plain values and a pure function.
#pragma once

#include <string>

namespace tessera {

struct GrammarLibraryPaths {
  // The llguidance wheel's shared library; default: where scripts/setup
  // unpacks it in the cache (CMake's TESSERA_LLGUIDANCE_LIBRARY).
  std::string llguidance_library;
  // The libpython that resolves that library's CPython symbols (a name the
  // dynamic loader finds, or a path); default: Debian 12's libpython3.11.
  std::string python_library;
};

GrammarLibraryPaths DefaultGrammarLibraryPaths();

}  // namespace tessera
