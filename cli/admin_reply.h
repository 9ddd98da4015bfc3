// What `tessera status` and `tessera plan --cluster` report when a call to a
// coordinator's admin endpoint does not answer 200: the URL, the HTTP status,
// the coordinator's own error message, and what to do about the usual causes
// (nothing listening, no or a wrong bearer token, the API listener asked for
// an admin path).
//
// Thread-safety: a pure function.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/net/http_client.h"

namespace tessera::cli {

// `reply` is what HttpCall returned for GET http://host:port + target, sent
// with a bearer token when `sent_token`. Returns:
//   kUnavailable        nothing answered (reply.status 0);
//   kInvalidArgument    401/403: the token is missing or was refused;
//   kNotFound           404: the listener does not serve the admin API;
//   kFailedPrecondition any other status.
// The message always starts with the URL.
Status AdminCallError(const std::string& host, int port, const std::string& target,
                      const HttpReply& reply, bool sent_token);

}  // namespace tessera::cli
