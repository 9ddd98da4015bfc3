// HttpsCall: one HTTPS exchange with a daemon on loopback, verifying its
// certificate against a CA file for the name "localhost" (Boost.Beast over
// OpenSSL). For the tests of the TLS listeners and DaemonCluster's readiness
// probe of an HTTPS coordinator.
//
// Thread-safety: each call is independent (its own io_context and TLS
// context); call from any thread.
#pragma once

#include <boost/beast/http/verb.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tessera::testing {

struct HttpsReply {
  int status = 0;  // 0: the exchange failed (see error)
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string error;
};

// `method` `target` on 127.0.0.1:`port` with `body` (sent as
// application/json when not empty) and `headers`; the connection, the
// handshake and the exchange are bounded at 60 s. Never throws: a failure
// is a reply with status 0 and `error` set.
HttpsReply HttpsCall(int port, const std::string& ca_file, boost::beast::http::verb method,
                     const std::string& target, const std::string& body = "",
                     const std::vector<std::pair<std::string, std::string>>& headers = {});

}  // namespace tessera::testing
