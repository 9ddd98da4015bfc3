#include "common/grammar/grammar_library_paths.h"

#ifndef TESSERA_LLGUIDANCE_LIBRARY
#define TESSERA_LLGUIDANCE_LIBRARY ""
#endif

namespace tessera {

GrammarLibraryPaths DefaultGrammarLibraryPaths() {
  return {TESSERA_LLGUIDANCE_LIBRARY, "libpython3.11.so.1.0"};
}

}  // namespace tessera
