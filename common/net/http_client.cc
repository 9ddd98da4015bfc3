#include "common/net/http_client.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace tessera {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

HttpReply HttpCall(int port, const std::string& method, const std::string& target,
                   const std::string& body, const std::string& bearer, const std::string& host,
                   const std::function<void(const std::string& event)>& on_event) {
  HttpReply out;
  try {
    boost::asio::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(120));
    stream.connect(resolver.resolve(host, std::to_string(port)));
    http::request<http::string_body> req{method == "GET" ? http::verb::get : http::verb::post,
                                         target, 11};
    req.set(http::field::host, host);
    req.set(http::field::content_type, "application/json");
    if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 * 1024 * 1024);
    // Read as it comes, taking each complete "data: ...\n\n" event out of
    // the body so far; a last event without its blank line is taken at the end.
    size_t pos = 0;  // where the next event may start in the body so far
    auto take_events = [&](bool at_end) {
      const std::string& b = parser.get().body();
      while (true) {
        const size_t start = b.find("data: ", pos);
        if (start == std::string::npos) {
          // "data: " may be split across reads: look again at the tail.
          pos = std::max(pos, b.size() >= 5 ? b.size() - 5 : size_t{0});
          return;
        }
        const size_t end = b.find("\n\n", start);
        if (end == std::string::npos && !at_end) {
          pos = start;
          return;
        }
        out.events.push_back(
            b.substr(start + 6, end == std::string::npos ? std::string::npos : end - start - 6));
        if (on_event) on_event(out.events.back());
        pos = end == std::string::npos ? b.size() : end;
      }
    };
    http::read_header(stream, buffer, parser);
    while (!parser.is_done()) {
      http::read_some(stream, buffer, parser);
      take_events(false);
    }
    take_events(true);
    out.status = static_cast<int>(parser.get().result_int());
    out.body = parser.get().body();
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  } catch (const std::exception& e) {
    out.status = 0;
    out.body = e.what();
  }
  return out;
}

}  // namespace tessera
