#include "common/net/ports_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/base/json_parse.h"
#include "common/net/endpoint.h"

namespace tessera {

std::string ListenerPortsJson(const ListenerPorts& ports) {
  return nlohmann::json{{"api", ports.api},
                        {"admin", ports.admin},
                        {"control", ports.control},
                        {"store", ports.store}}
      .dump();
}

StatusOr<int> EndpointPort(const std::string& endpoint) {
  StatusOr<TcpEndpoint> parsed = ParseTcpEndpoint(endpoint, EndpointUse::kBind);
  if (!parsed.ok())
    return InvalidArgument("bound endpoint '" + endpoint + "': " + parsed.status().message());
  if (parsed->port == 0) return InvalidArgument("bound endpoint '" + endpoint + "' has port 0");
  return parsed->port;
}

Status WritePortsFile(const std::string& path, const ListenerPorts& ports) {
  return WritePortsJson(path, ListenerPortsJson(ports));
}

Status WritePortsJson(const std::string& path, const std::string& json_text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return IoError("--ports-file: cannot write " + tmp + ": " + std::strerror(errno));
    out << json_text << "\n";
    out.flush();
    if (!out) return IoError("--ports-file: cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return IoError("--ports-file: cannot rename " + tmp + " to " + path + ": " + why);
  }
  return Status::Ok();
}

StatusOr<ListenerPorts> ReadPortsFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": no ports file (yet)");
  std::stringstream text;
  text << in.rdbuf();
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonBounded(text.str(), 4, path));
  if (!j.is_object()) return InvalidArgument(path + ": expected a JSON object of ports");
  ListenerPorts p;
  for (auto [key, out] : {std::pair{"api", &p.api},
                          {"admin", &p.admin},
                          {"control", &p.control},
                          {"store", &p.store}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer())
      return InvalidArgument(path + ": '" + key + "' must be a port number");
    const int64_t v = it->get<int64_t>();
    if (v < 1 || v > 65535)
      return InvalidArgument(path + ": '" + key + "' is " + std::to_string(v) +
                             ", not a port in 1..65535");
    *out = static_cast<int>(v);
  }
  return p;
}

}  // namespace tessera
