// A small synchronous HTTP/1.1 client over Boost.Beast, for `tessera up`,
// `tessera status` and the daemon tests. One connection per call; SSE
// responses are read to the end and split into their "data:" payloads.
// Thread-safety: HttpCall may run on many threads at once.
#pragma once

#include <string>
#include <vector>

namespace tessera {

struct HttpReply {
  int status = 0;  // 0 when the connection failed
  std::string body;
  std::vector<std::string> events;  // SSE "data:" payloads, in order
};

// method "GET" or "POST"; `bearer` adds an Authorization header when
// non-empty. Errors: status 0 and the reason in body when the connection
// failed.
HttpReply HttpCall(int port, const std::string& method, const std::string& target,
                   const std::string& body = "", const std::string& bearer = "",
                   const std::string& host = "127.0.0.1");

}  // namespace tessera
