// ParseTcpEndpoint / ParseHostPort / FormatTcpEndpoint (common/net/endpoint.h):
// the one parser of "tcp://HOST:PORT" behind the config, the daemons, the CLI
// and the ports file. IPv6 literals come back without brackets (what
// getaddrinfo takes) and format back with them; a bind endpoint may be a
// wildcard on port 0, a connect endpoint may not; bad shapes get the
// messages the config shows after the key name.
#include "common/net/endpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/net/ports_file.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TcpEndpoint Parsed(const std::string& text, EndpointUse use) {
  StatusOr<TcpEndpoint> ep = ParseTcpEndpoint(text, use);
  EXPECT_TRUE(ep.ok()) << text << ": " << ep.status().ToString();
  return ep.ok() ? *ep : TcpEndpoint{"<error>", -1};
}

std::string ParseError(const std::string& text, EndpointUse use) {
  StatusOr<TcpEndpoint> ep = ParseTcpEndpoint(text, use);
  EXPECT_FALSE(ep.ok()) << text << " parsed as " << (ep.ok() ? ep->host : "");
  if (ep.ok()) return "";
  EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument) << text;
  return ep.status().message();
}

TEST(ParseTcpEndpoint, NamesAndIPv4Addresses) {
  for (EndpointUse use : {EndpointUse::kBind, EndpointUse::kConnect}) {
    TcpEndpoint ep = Parsed("tcp://127.0.0.1:5555", use);
    EXPECT_EQ(ep.host, "127.0.0.1");
    EXPECT_EQ(ep.port, 5555);
    ep = Parsed("tcp://coordinator.example-1:1", use);
    EXPECT_EQ(ep.host, "coordinator.example-1");
    EXPECT_EQ(ep.port, 1);
    EXPECT_EQ(Parsed("tcp://h:65535", use).port, 65535);
  }
}

TEST(ParseTcpEndpoint, IPv6LiteralLosesItsBracketsAndFormatsBackWithThem) {
  TcpEndpoint ep = Parsed("tcp://[::1]:5555", EndpointUse::kConnect);
  EXPECT_EQ(ep.host, "::1");
  EXPECT_EQ(ep.port, 5555);
  EXPECT_EQ(FormatTcpEndpoint(ep.host, ep.port), "tcp://[::1]:5555");
  ep = Parsed("tcp://[fe80::1:2]:80", EndpointUse::kBind);
  EXPECT_EQ(ep.host, "fe80::1:2");
  EXPECT_EQ(FormatTcpEndpoint(ep.host, ep.port), "tcp://[fe80::1:2]:80");
  // The bare form: the last ':' ends the host.
  ep = Parsed("tcp://::1:5555", EndpointUse::kConnect);
  EXPECT_EQ(ep.host, "::1");
  EXPECT_EQ(ep.port, 5555);
}

TEST(ParseTcpEndpoint, FormatRoundTrips) {
  for (const char* text : {"tcp://127.0.0.1:5555", "tcp://[::1]:5555", "tcp://host-a:1",
                           "tcp://[2001:db8::7]:65535"}) {
    TcpEndpoint ep = Parsed(text, EndpointUse::kConnect);
    EXPECT_EQ(FormatTcpEndpoint(ep.host, ep.port), text);
  }
  EXPECT_EQ(FormatHostPort("::1", 7), "[::1]:7");
  EXPECT_EQ(FormatHostPort("[::1]", 7), "[::1]:7");  // not bracketed twice
  EXPECT_EQ(FormatHostPort("10.0.0.2", 7), "10.0.0.2:7");
}

TEST(ParseTcpEndpoint, WildcardAndPortZeroOnlyToBind) {
  for (const char* text : {"tcp://*:5555", "tcp://0.0.0.0:5555", "tcp://[::]:5555"}) {
    EXPECT_TRUE(IsWildcardHost(Parsed(text, EndpointUse::kBind).host)) << text;
    EXPECT_EQ(ParseError(text, EndpointUse::kConnect),
              std::string("must name a host to connect to, got the wildcard \"") + text + "\"");
  }
  EXPECT_EQ(Parsed("tcp://*:5555", EndpointUse::kBind).host, "*");
  EXPECT_EQ(Parsed("tcp://[::]:0", EndpointUse::kBind).host, "::");
  EXPECT_EQ(Parsed("tcp://127.0.0.1:0", EndpointUse::kBind).port, 0);
  EXPECT_EQ(ParseError("tcp://h:0", EndpointUse::kConnect), "port must be in 1..65535, got 0");
  EXPECT_EQ(ParseError("tcp://h:70000", EndpointUse::kBind), "port must be in 0..65535, got 70000");
}

TEST(ParseTcpEndpoint, BadShapesNameWhatIsWrong) {
  const EndpointUse bind = EndpointUse::kBind;
  EXPECT_EQ(ParseError("127.0.0.1:5555", bind),
            "must be \"tcp://HOST:PORT\", got \"127.0.0.1:5555\"");
  EXPECT_EQ(ParseError("udp://h:1", bind), "must be \"tcp://HOST:PORT\", got \"udp://h:1\"");
  EXPECT_EQ(ParseError("tcp://h", bind), "must be \"tcp://HOST:PORT\", got \"tcp://h\"");
  EXPECT_EQ(ParseError("tcp://:1", bind), "must be \"tcp://HOST:PORT\", got \"tcp://:1\"");
  EXPECT_EQ(ParseError("tcp://", bind), "must be \"tcp://HOST:PORT\", got \"tcp://\"");
  EXPECT_EQ(ParseError("tcp://h:", bind),
            "must be \"tcp://HOST:PORT\" with a numeric PORT, got \"tcp://h:\"");
  EXPECT_EQ(ParseError("tcp://h:x1", bind),
            "must be \"tcp://HOST:PORT\" with a numeric PORT, got \"tcp://h:x1\"");
  EXPECT_EQ(ParseError("tcp://h:-1", bind),
            "must be \"tcp://HOST:PORT\" with a numeric PORT, got \"tcp://h:-1\"");
  EXPECT_EQ(ParseError("tcp://h:123456", bind),
            "must be \"tcp://HOST:PORT\" with a numeric PORT, got \"tcp://h:123456\"");
  EXPECT_EQ(ParseError("tcp://bad host:1", bind),
            "HOST must be a host name or IP address, got \"tcp://bad host:1\"");
  EXPECT_EQ(ParseError("tcp://[::1:5555", bind),
            "HOST must be a host name or IP address, got \"tcp://[::1:5555\"");
  EXPECT_EQ(ParseError("tcp://[]:5555", bind),
            "HOST must be a host name or IP address, got \"tcp://[]:5555\"");
  // Control characters are shown escaped, not printed raw.
  EXPECT_EQ(ParseError("tcp://a\nb:1", bind),
            "HOST must be a host name or IP address, got \"tcp://a\\nb:1\"");
}

TEST(ParseHostPort, SameRulesWithoutAScheme) {
  StatusOr<TcpEndpoint> ep = ParseHostPort("127.0.0.1:29500", EndpointUse::kConnect);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  EXPECT_EQ(ep->host, "127.0.0.1");
  EXPECT_EQ(ep->port, 29500);
  ep = ParseHostPort("[::1]:29500", EndpointUse::kConnect);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  EXPECT_EQ(ep->host, "::1");
  EXPECT_EQ(ParseHostPort("29500", EndpointUse::kConnect).status().message(),
            "must be \"HOST:PORT\", got \"29500\"");
  EXPECT_EQ(ParseHostPort("h:0", EndpointUse::kConnect).status().message(),
            "port must be in 1..65535, got 0");
}

TEST(EndpointPort, ThePortOfABoundEndpoint) {
  EXPECT_EQ(*EndpointPort("tcp://127.0.0.1:41234"), 41234);
  EXPECT_EQ(*EndpointPort("tcp://[::1]:41235"), 41235);
  EXPECT_EQ(*EndpointPort("tcp://0.0.0.0:41236"), 41236);
  EXPECT_THAT(EndpointPort("tcp://127.0.0.1:0").status().message(), HasSubstr("has port 0"));
  EXPECT_THAT(EndpointPort("inproc://x").status().message(),
              HasSubstr("bound endpoint 'inproc://x': must be \"tcp://HOST:PORT\""));
}

TEST(EndpointHost, ConnectHostWithoutBrackets) {
  EXPECT_EQ(*EndpointHost("tcp://[::1]:5555"), "::1");
  EXPECT_THAT(EndpointHost("tcp://*:5555").status().message(),
              HasSubstr("endpoint 'tcp://*:5555': must name a host to connect to"));
}

}  // namespace
}  // namespace tessera
