#include "cli/admin_reply.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace tessera::cli {

namespace {

// The coordinator's error message ({"error":{"message":...}}), else the body.
std::string ServerMessage(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return body;
}

}  // namespace

Status AdminCallError(const std::string& host, int port, const std::string& target,
                      const HttpReply& reply, bool sent_token) {
  const std::string url = fmt::format("http://{}:{}{}", host, port, target);
  switch (reply.status) {
    case 0:
      return Unavailable(fmt::format(
          "{}: {} (is the coordinator running, and is this its admin.host and admin.port?)", url,
          reply.body));
    case 401:
    case 403:
      return InvalidArgument(fmt::format(
          "{}: {} {}: {}", url, reply.status, ServerMessage(reply.body),
          sent_token ? "the coordinator refused this --token (compare admin.token in its config)"
                     : "the coordinator wants its admin token: pass --token (admin.token in its "
                       "config)"));
    case 404:
      return NotFound(fmt::format(
          "{}: 404 {}: this listener does not serve the admin API; a coordinator with a separate "
          "admin listener serves it on admin.port (8001 unless set), not on server.port",
          url, ServerMessage(reply.body)));
    default:
      return FailedPrecondition(
          fmt::format("{}: {} {}", url, reply.status, ServerMessage(reply.body)));
  }
}

}  // namespace tessera::cli
