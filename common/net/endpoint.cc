#include "common/net/endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera {

StatusOr<std::string> EndpointHost(const std::string& endpoint) {
  const std::string bad = "endpoint '" + endpoint + "' is not tcp://HOST:PORT";
  if (endpoint.rfind("tcp://", 0) != 0) return InvalidArgument(bad);
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument(bad);
  std::string host = rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) return InvalidArgument(bad);
  return host;
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
