#include "support/https_client.h"

#include <openssl/ssl.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <chrono>
#include <exception>

namespace tessera::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

HttpsReply HttpsCall(int port, const std::string& ca_file, http::verb method,
                     const std::string& target, const std::string& body,
                     const std::vector<std::pair<std::string, std::string>>& headers) {
  HttpsReply reply;
  try {
    net::io_context ioc;
    ssl::context ctx(ssl::context::tls_client);
    ctx.load_verify_file(ca_file);
    ctx.set_verify_mode(ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(ioc, ctx);
    SSL_set_tlsext_host_name(stream.native_handle(), "localhost");
    stream.set_verify_callback(ssl::host_name_verification("localhost"));
    beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(60));
    beast::get_lowest_layer(stream).connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    stream.handshake(ssl::stream_base::client);
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "localhost");
    for (const auto& [k, v] : headers) req.set(k, v);
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res);
    reply.status = static_cast<int>(res.result_int());
    reply.body = res.body();
    for (const auto& f : res) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      reply.headers[name] = std::string(f.value());
    }
  } catch (const std::exception& e) {
    reply.error = e.what();
  }
  return reply;
}

}  // namespace tessera::testing
