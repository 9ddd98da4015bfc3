// Control-plane endpoints: "tcp://HOST:PORT" strings as ZeroMQ and the
// config use them, with HOST a name, an IPv4 address or an IPv6 literal,
// bracketed ("tcp://[::1]:5555"; the bare form "tcp://::1:5555" is read too,
// the last ':' ending the host). The one parser and formatter of that shape:
// the config validation, the daemons, the CLI and the ports file use these.
//
// Thread-safety: pure functions (LocalAddressToward opens a socket).
#pragma once

#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

// What an endpoint is for: kBind may name a wildcard host ("*", "0.0.0.0",
// "::") and port 0 (the kernel picks one); kConnect must name a host and a
// port in 1..65535.
enum class EndpointUse { kBind, kConnect };

// A parsed "tcp://HOST:PORT".
struct TcpEndpoint {
  std::string host;  // brackets of an IPv6 literal removed ("::1"): ready for getaddrinfo
  int port = 0;      // 0..65535 (0 only for EndpointUse::kBind)
};

// True for the hosts that mean every interface: "*", "0.0.0.0", "::" (also
// bracketed, "[::]").
bool IsWildcardHost(std::string_view host);

// True for a host name, an IPv4 address or an IPv6 address (bare or in
// brackets): 1..253 characters of [A-Za-z0-9._:-]. A syntax check; nothing
// is resolved.
bool IsHostSyntax(std::string_view host);

// Parses "tcp://HOST:PORT" for `use`.
// Errors: kInvalidArgument with what is wrong (the config prefixes the key),
// one of:
//   must be "tcp://HOST:PORT", got "<text>"
//   must be "tcp://HOST:PORT" with a numeric PORT, got "<text>"
//   port must be in 0..65535, got N              (1..65535 for kConnect)
//   HOST must be a host name or IP address, got "<text>"
//   must name a host to connect to, got the wildcard "<text>"   (kConnect)
StatusOr<TcpEndpoint> ParseTcpEndpoint(std::string_view text, EndpointUse use);

// Parses "HOST:PORT" (no scheme: a TCP store address, the tail of a URL)
// for `use`, by the same rules and with the same messages as
// ParseTcpEndpoint, the shape named "HOST:PORT".
StatusOr<TcpEndpoint> ParseHostPort(std::string_view text, EndpointUse use);

// "HOST:PORT", an IPv6 host (one with a ':') bracketed: "[::1]:5555". A host
// given bracketed is not bracketed twice.
std::string FormatHostPort(std::string_view host, int port);

// "tcp://" + FormatHostPort(host, port): the inverse of ParseTcpEndpoint
// ("tcp://[::1]:5555" formats back from {"::1", 5555}).
std::string FormatTcpEndpoint(std::string_view host, int port);

// The address of this host's interface that routes to the host of
// `endpoint` ("tcp://HOST:PORT"): a UDP socket is connected there (no packet
// is sent) and its local address read. "127.0.0.1" for a loopback
// coordinator. This is the address peers reach the worker at when the
// coordinator is reachable from all of them.
// Errors: kInvalidArgument for an endpoint that is not tcp://HOST:PORT;
// kUnavailable naming the host when it does not resolve or has no route.
StatusOr<std::string> LocalAddressToward(const std::string& endpoint);

// The HOST of "tcp://HOST:PORT" to connect to (brackets of an IPv6 literal
// removed): ParseTcpEndpoint(endpoint, kConnect).host.
// Errors: kInvalidArgument naming the endpoint.
StatusOr<std::string> EndpointHost(const std::string& endpoint);

}  // namespace tessera
