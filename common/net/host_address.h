// Deciding whether a configured host stays on this machine: the check behind
// "an admin API without a token, or a control plane without CURVE, is
// allowed only on loopback" (common/config/daemon_config.cc).
//
// Thread-safety: free functions, safe from any thread (getaddrinfo).
#pragma once

#include <string>

namespace tessera {

// True when every address `host` stands for is a loopback address: an IPv4
// address in 127.0.0.0/8, the IPv6 address ::1 (bare or in brackets, also
// as ::ffff:127.x.y.z), or a name that resolves (getaddrinfo: /etc/hosts,
// DNS) to such addresses only ("localhost"). A name that does not resolve,
// a wildcard ("0.0.0.0", "::", "*") and any other address are not loopback:
// "127.evil.example" is a name, and counts only if it resolves to loopback.
bool IsLoopbackHost(const std::string& host);

}  // namespace tessera
