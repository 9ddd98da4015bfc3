#include "common/net/http_request_checks.h"

#include <fmt/format.h>

#include <cctype>

namespace tessera {

namespace {

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

HeaderRefusal BadRequest(std::string message) {
  return HeaderRefusal{400, std::move(message), "bad_request"};
}

}  // namespace

std::optional<HeaderRefusal> CheckRequestHeader(
    unsigned version, const std::vector<std::pair<std::string_view, std::string_view>>& fields) {
  int transfer_encodings = 0, content_lengths = 0, hosts = 0, authorizations = 0;
  std::string_view transfer_encoding;
  for (const auto& [name, value] : fields) {
    if (AsciiIEquals(name, "Transfer-Encoding")) {
      ++transfer_encodings;
      transfer_encoding = value;
    } else if (AsciiIEquals(name, "Content-Length")) {
      ++content_lengths;
    } else if (AsciiIEquals(name, "Host")) {
      ++hosts;
    } else if (AsciiIEquals(name, "Authorization")) {
      ++authorizations;
    }
  }
  if (transfer_encodings > 1)
    return BadRequest(fmt::format(
        "the request has {} Transfer-Encoding fields; send one, \"Transfer-Encoding: chunked\"",
        transfer_encodings));
  if (transfer_encodings == 1) {
    if (version < 11)
      return BadRequest(
          "Transfer-Encoding is not allowed in an HTTP/1.0 request; send Content-Length");
    if (content_lengths > 0)
      return BadRequest(
          "the request has both Transfer-Encoding and Content-Length; send one of them");
    if (!AsciiIEquals(TrimOws(transfer_encoding), "chunked"))
      return HeaderRefusal{
          501,
          fmt::format("Transfer-Encoding \"{}\" is not supported; the only transfer coding "
                      "accepted is \"chunked\"",
                      TrimOws(transfer_encoding)),
          "unsupported_transfer_encoding"};
  }
  if (content_lengths > 1)
    return BadRequest(
        fmt::format("the request has {} Content-Length fields; send one", content_lengths));
  if (hosts > 1) return BadRequest(fmt::format("the request has {} Host fields; send one", hosts));
  if (hosts == 0 && version >= 11) return BadRequest("an HTTP/1.1 request needs a Host field");
  if (authorizations > 1)
    return BadRequest(
        fmt::format("the request has {} Authorization fields; send one", authorizations));
  return std::nullopt;
}

bool AsciiIEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace tessera
