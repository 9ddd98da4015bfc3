// Helpers of the daemon-config tests (daemon_config_test.cc,
// daemon_config_validation_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/config/daemon_config.h"

namespace tessera {

// The error message of parsing `text` as "x.toml"; "" when it parsed (and a
// failure is always kInvalidArgument).
inline std::string ParseError(const std::string& text) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(text, "x.toml");
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
  return c.status().message();
}

}  // namespace tessera
