// Checks on a request's header that Boost.Beast's parser leaves to the
// server: message framing that a proxy in front of the coordinator could
// read differently (request smuggling), and header fields whose repetition
// makes the request ambiguous.
//
//   Transfer-Encoding other than exactly "chunked"   501 (not implemented)
//   Transfer-Encoding in an HTTP/1.0 request         400
//   Transfer-Encoding together with Content-Length   400
//   more than one Transfer-Encoding field            400
//   more than one Content-Length, Host or
//     Authorization field                            400
//   an HTTP/1.1 request without Host                 400
//
// The server answers a refused request with the error and closes the
// connection without reading what follows (so bytes meant as a body never
// become a second request).
//
// Thread-safety: free functions, safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

// Why a request header is refused: the HTTP status, a message naming the
// field, and the OpenAI error code.
struct HeaderRefusal {
  int status = 400;
  std::string message;
  std::string code;
};

// True when `a` and `b` are equal ignoring ASCII case (HTTP field names and
// tokens compare so).
bool AsciiIEquals(std::string_view a, std::string_view b);

// Checks the header `fields` (name, value; in order as sent) of a request of
// HTTP `version` (10 or 11). nullopt when the header is acceptable.
std::optional<HeaderRefusal> CheckRequestHeader(
    unsigned version, const std::vector<std::pair<std::string_view, std::string_view>>& fields);

}  // namespace tessera
