// IsLoopbackHost (common/net/host_address.h): addresses are parsed and
// names resolved, so a name that merely starts with "127." is not loopback;
// and the config checks built on it (an admin API without a token, a
// control plane without CURVE) refuse such a name.
#include "common/net/host_address.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/config/daemon_config.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(IsLoopbackHost, LoopbackAddressesAndNames) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "127.255.255.254", "::1", "[::1]",
                           "::ffff:127.0.0.1", "[::ffff:127.9.8.7]", "localhost"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
}

TEST(IsLoopbackHost, OtherAddressesWildcardsAndUnresolvableNamesAreNot) {
  for (const char* host : {"127.evil.example", "127.0.0.1.evil.example", "0.0.0.0", "::", "[::]",
                           "*", "10.0.0.1", "128.0.0.1", "::2", "::ffff:10.0.0.1", "[::1", "",
                           "tessera-no-such-host.invalid", "localhost.invalid"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

// The message of parsing `text` as "x.toml"; "" when it parsed.
std::string ParseError(const std::string& text) {
  StatusOr<DaemonConfig> c = ParseDaemonConfig(text, "x.toml");
  return c.ok() ? "" : c.status().message();
}

TEST(IsLoopbackHost, ANameLookingLikeLoopbackNeedsTheAdminToken) {
  EXPECT_EQ(ParseError("[admin]\nhost = \"127.evil.example\"\n"),
            "x.toml:2:8: admin.host: \"127.evil.example\" exposes the admin API beyond loopback "
            "without a token; set admin.token or admin.token_file, or give the admin API a "
            "loopback address");
  EXPECT_EQ(ParseError("[admin]\nhost = \"localhost\"\n"), "");
  EXPECT_EQ(ParseError("[admin]\nhost = \"127.1.2.3\"\n"), "");
  EXPECT_EQ(ParseError("[admin]\nhost = \"127.evil.example\"\ntoken = \"t0k\"\n"), "");
}

TEST(IsLoopbackHost, ANameLookingLikeLoopbackNeedsCurve) {
  EXPECT_THAT(ParseError("[server]\ncontrol_endpoint = \"tcp://127.evil.example:5555\"\n"),
              HasSubstr("server.control_endpoint: \"tcp://127.evil.example:5555\" exposes the "
                        "control plane beyond loopback without CURVE"));
  EXPECT_THAT(ParseError("[worker]\ncoordinator = \"tcp://127.evil.example:5555\"\n"),
              HasSubstr("worker.coordinator: \"tcp://127.evil.example:5555\" is beyond loopback: "
                        "the control plane needs CURVE"));
  EXPECT_EQ(ParseError("[server]\ncontrol_endpoint = \"tcp://localhost:5555\"\n"), "");
  EXPECT_EQ(ParseError("[worker]\ncoordinator = \"tcp://[::1]:5555\"\n"), "");
}

}  // namespace
}  // namespace tessera
