// Internals of HttpServer (common/net/http_server.h), not a public API: the
// bytes of HTTP/1.1 on the wire that a Session reads and writes. Query
// parsing (percent-decoding, RFC 3986 section 2.1, '+' as a space as HTML
// forms send it), complete responses with Content-Length, the header of a
// Server-Sent Events stream and one SSE event (the WHATWG HTML "Server-sent
// events" format: "data:" lines ended by a blank line), and the interim
// probe a half-closed connection is watched with. Included by
// http_session.h and http_server.cc only.
//
// Thread-safety: pure functions.
#pragma once

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::http_internal {

namespace beast = boost::beast;
namespace http = beast::http;

inline int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes %XX escapes and '+' (a space in a query component). A malformed
// escape is kept as written.
inline std::string PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 &&
               HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

inline std::map<std::string, std::string> ParseQuery(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    std::string key = PercentDecode(part.substr(0, eq));
    std::string value = eq == std::string_view::npos ? "" : PercentDecode(part.substr(eq + 1));
    out.emplace(std::move(key), std::move(value));
  }
  return out;
}

// The bytes of a complete response with Content-Length.
inline std::string SerializeResponse(
    int status, const std::string& content_type, std::string body,
    const std::vector<std::pair<std::string, std::string>>& headers, unsigned version,
    bool keep_alive) {
  if (status < 100 || status > 599) status = 500;
  http::response<http::string_body> res;
  res.version(version);
  res.result(static_cast<unsigned>(status));
  res.set(http::field::server, "tessera");
  res.set(http::field::content_type, content_type);
  for (const auto& [name, value] : headers) res.set(name, value);
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  std::ostringstream os;
  os << res;
  return os.str();
}

// The header of a Server-Sent Events response.
inline std::string SerializeStreamHeader(int status, unsigned version, bool chunked,
                                         bool keep_alive) {
  if (status < 100 || status > 599) status = 500;
  http::response<http::empty_body> res;
  res.version(version);
  res.result(static_cast<unsigned>(status));
  res.set(http::field::server, "tessera");
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-cache");
  res.set("X-Accel-Buffering", "no");
  if (chunked) res.chunked(true);
  res.keep_alive(keep_alive);
  std::ostringstream os;
  os << res.base();
  return os.str();
}

// "data: <line>\n" per line of `data`, then a blank line.
inline std::string SseEvent(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  size_t start = 0;
  while (true) {
    size_t nl = data.find('\n', start);
    std::string_view line = data.substr(start, nl == std::string_view::npos ? nl : nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out += "data: ";
    out += line;
    out += '\n';
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  out += '\n';
  return out;
}

inline std::string_view View(beast::string_view s) { return {s.data(), s.size()}; }

inline bool IsHttpCategory(const beast::error_code& ec) {
  return &ec.category() == &http::make_error_code(http::error::end_of_stream).category();
}

// What a connection whose client half-closed (shut down its sending side
// after the request) is probed with while its response is pending: a write
// to a client that closed entirely draws a TCP reset, so the probe after it
// fails and the client is known gone; a half-closed client reads and ignores
// it. Before the response starts, an interim 100 (Continue) response, which
// every HTTP/1.1 client must accept unsolicited (RFC 9110 section 15.2: "A
// client MUST be able to parse one or more 1xx responses received prior to a
// final response, even if the client does not expect one"); inside a
// Server-Sent Events stream, a comment line, which clients ignore (WHATWG
// HTML, "Server-sent events": a line starting with ':').
inline constexpr std::string_view kInterimProbe = "HTTP/1.1 100 Continue\r\n\r\n";
inline std::string StreamProbe(bool chunked) {
  return chunked ? std::string("3\r\n:\n\n\r\n") : std::string(":\n\n");
}

}  // namespace tessera::http_internal
