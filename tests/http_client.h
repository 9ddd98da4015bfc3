// A small synchronous HTTP/1.1 client over Boost.Beast for the daemon tests.
#pragma once

#include <string>
#include <vector>

namespace tessera::testing {

struct HttpReply {
  int status = 0;  // 0 when the connection failed
  std::string body;
  std::vector<std::string> events;  // SSE "data:" payloads, in order
};

// method "GET" or "POST"; `bearer` adds an Authorization header when non-empty.
HttpReply HttpCall(int port, const std::string& method, const std::string& target,
                   const std::string& body = "", const std::string& bearer = "");

}  // namespace tessera::testing
