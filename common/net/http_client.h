// A small synchronous HTTP/1.1 client over Boost.Beast, for `tessera up`,
// `tessera status` and the daemon tests. One connection per call; SSE
// responses are read to the end and split into their "data:" payloads, each
// also handed to `on_event` as soon as it arrives (for printing a stream).
// Thread-safety: HttpCall may run on many threads at once.
#pragma once

#include <functional>
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
// `on_event`, when set, is called on the calling thread with each SSE
// "data:" payload as it is read (before HttpCall returns).
HttpReply HttpCall(int port, const std::string& method, const std::string& target,
                   const std::string& body = "", const std::string& bearer = "",
                   const std::string& host = "127.0.0.1",
                   const std::function<void(const std::string& event)>& on_event = nullptr);

}  // namespace tessera
