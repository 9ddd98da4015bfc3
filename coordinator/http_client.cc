#include "coordinator/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace tessera {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

HttpReply HttpCall(int port, const std::string& method, const std::string& target,
                   const std::string& body, const std::string& bearer, const std::string& host) {
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
    http::read(stream, buffer, parser);
    out.status = static_cast<int>(parser.get().result_int());
    out.body = parser.get().body();
    size_t pos = 0;
    while ((pos = out.body.find("data: ", pos)) != std::string::npos) {
      const size_t end = out.body.find("\n\n", pos);
      out.events.push_back(
          out.body.substr(pos + 6, end == std::string::npos ? std::string::npos : end - pos - 6));
      pos = end == std::string::npos ? out.body.size() : end;
    }
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  } catch (const std::exception& e) {
    out.status = 0;
    out.body = e.what();
  }
  return out;
}

}  // namespace tessera
