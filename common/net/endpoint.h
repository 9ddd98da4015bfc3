// Control-plane endpoints: "tcp://HOST:PORT" strings as ZeroMQ and the
// config use them, with HOST a name, an IPv4 address or a bracketed IPv6
// literal ("tcp://[::1]:5555").
//
// Thread-safety: pure functions (LocalAddressToward opens a socket).
#pragma once

#include <string>

#include "common/base/status.h"

namespace tessera {

// The address of this host's interface that routes to the host of
// `endpoint` ("tcp://HOST:PORT"): a UDP socket is connected there (no packet
// is sent) and its local address read. "127.0.0.1" for a loopback
// coordinator. This is the address peers reach the worker at when the
// coordinator is reachable from all of them.
// Errors: kInvalidArgument for an endpoint that is not tcp://HOST:PORT;
// kUnavailable naming the host when it does not resolve or has no route.
StatusOr<std::string> LocalAddressToward(const std::string& endpoint);

// The HOST of "tcp://HOST:PORT" (brackets of an IPv6 literal removed).
// Errors: kInvalidArgument naming the endpoint.
StatusOr<std::string> EndpointHost(const std::string& endpoint);

}  // namespace tessera
