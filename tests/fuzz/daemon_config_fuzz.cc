// libFuzzer harness: TOML daemon config parsing and validation
// (ParseDaemonConfig). An accepted config must format back to TOML that
// parses to the same config.
#include <cstdint>
#include <string>

#include "common/config/daemon_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ParseDaemonConfig(text, "fuzz.toml");
  if (!config.ok()) {
    if (config.status().message().rfind("fuzz.toml", 0) != 0)
      fuzz::Fail("error does not name the file: " + config.status().ToString());
    return 0;
  }
  const std::string formatted = FormatDaemonConfig(*config, false);
  auto again = ParseDaemonConfig(formatted, "formatted.toml");
  if (!again.ok())
    fuzz::Fail("the formatted config does not parse: " + again.status().ToString() + "\n" +
               formatted);
  if (FormatDaemonConfig(*again, false) != formatted)
    fuzz::Fail("format(parse(format(c))) != format(c):\n" + formatted);
  return 0;
}
