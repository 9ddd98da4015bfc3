#include "common/net/host_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

namespace tessera {

namespace {

bool IsLoopbackV4(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

bool IsLoopbackV6(const in6_addr& a) {
  if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
  if (IN6_IS_ADDR_V4MAPPED(&a)) {
    in_addr v4;
    std::memcpy(&v4, a.s6_addr + 12, sizeof v4);
    return IsLoopbackV4(v4);
  }
  return false;
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty() || h == "*") return false;
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return IsLoopbackV4(v4);
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IsLoopbackV6(v6);
  // A name (or a short numeric form such as "127.1"): every address it
  // resolves to must be loopback.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(h.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  bool all_loopback = true;
  for (const addrinfo* ai = res; ai != nullptr && all_loopback; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      all_loopback = IsLoopbackV4(reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr);
    } else if (ai->ai_family == AF_INET6) {
      all_loopback = IsLoopbackV6(reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr);
    } else {
      all_loopback = false;
    }
  }
  freeaddrinfo(res);
  return all_loopback;
}

}  // namespace tessera
