#include "common/net/endpoint.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "common/base/quote.h"

namespace tessera {

namespace {

std::string_view Unbracketed(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

}  // namespace

bool IsWildcardHost(std::string_view host) {
  const std::string_view h = Unbracketed(host);
  return h == "*" || h == "0.0.0.0" || h == "::";
}

bool IsHostSyntax(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  std::string_view h = host;
  if (h.front() == '[') {
    if (h.back() != ']' || h.size() < 3) return false;
    h = h.substr(1, h.size() - 2);
  }
  return std::all_of(h.begin(), h.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' ||
           ch == ':';
  });
}

namespace {

// HOST:PORT in `rest`, the tail of `text` after its scheme; `shape` names
// the whole form for the messages ("tcp://HOST:PORT").
StatusOr<TcpEndpoint> ParseAfterScheme(std::string_view text, std::string_view rest,
                                       std::string_view shape_text, EndpointUse use) {
  const std::string shape = "must be \"" + std::string(shape_text) + "\"";
  const std::string quoted = QuoteForMessage(text);
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    return InvalidArgument(shape + ", got " + quoted);
  const std::string_view host = rest.substr(0, colon);
  const std::string_view port_text = rest.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgument(shape + " with a numeric PORT, got " + quoted);
  }
  TcpEndpoint out;
  out.port = std::stoi(std::string(port_text));
  const bool bind = use == EndpointUse::kBind;
  const int lowest = bind ? 0 : 1;
  if (out.port < lowest || out.port > 65535)
    return InvalidArgument(fmt::format("port must be in {}..65535, got {}", lowest, out.port));
  if (host != "*" && !IsHostSyntax(host))
    return InvalidArgument("HOST must be a host name or IP address, got " + quoted);
  if (!bind && IsWildcardHost(host))
    return InvalidArgument("must name a host to connect to, got the wildcard " + quoted);
  out.host = std::string(Unbracketed(host));
  return out;
}

}  // namespace

StatusOr<TcpEndpoint> ParseTcpEndpoint(std::string_view text, EndpointUse use) {
  constexpr std::string_view kScheme = "tcp://";
  if (text.substr(0, kScheme.size()) != kScheme)
    return InvalidArgument("must be \"tcp://HOST:PORT\", got " + QuoteForMessage(text));
  return ParseAfterScheme(text, text.substr(kScheme.size()), "tcp://HOST:PORT", use);
}

StatusOr<TcpEndpoint> ParseHostPort(std::string_view text, EndpointUse use) {
  return ParseAfterScheme(text, text, "HOST:PORT", use);
}

std::string FormatHostPort(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos && Unbracketed(host) == host)
    return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string FormatTcpEndpoint(std::string_view host, int port) {
  return "tcp://" + FormatHostPort(host, port);
}

StatusOr<std::string> EndpointHost(const std::string& endpoint) {
  auto parsed = ParseTcpEndpoint(endpoint, EndpointUse::kConnect);
  if (!parsed.ok())
    return InvalidArgument("endpoint '" + endpoint + "': " + parsed.status().message());
  return parsed->host;
}

StatusOr<std::string> LocalAddressToward(const std::string& endpoint) {
  TESSERA_ASSIGN_OR_RETURN(std::string host, EndpointHost(endpoint));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0)
    return Unavailable("cannot resolve the coordinator host '" + host + "': " + gai_strerror(rc));
  std::string out, err = "no address";
  for (addrinfo* a = res; a && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* src =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, src, buf, sizeof buf)) out = buf;
    } else {
      err = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (out.empty()) return Unavailable("no route to the coordinator host '" + host + "': " + err);
  return out;
}

}  // namespace tessera
