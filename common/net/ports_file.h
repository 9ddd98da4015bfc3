// The ports a coordinator bound, for whoever started it: with server.port = 0,
// admin.pick_port = true or a control endpoint "tcp://HOST:0" the kernel
// picks the ports, so nothing else can take them between choosing and
// binding; `tessera-coordinator --ports-file PATH` then tells the starter
// which ones it got.
//
// The file is one JSON object, written once every listener is bound:
//   {"api": 41233, "admin": 41234, "control": 41235, "store": 41236}
// "admin" equals "api" when the admin API is served on the API listener
// (admin.port = 0). It is written to PATH.tmp and renamed to PATH, so a
// reader that sees PATH sees all of it.
//
// Thread-safety: free functions, safe from any thread.
#pragma once

#include <string>

#include "common/base/status.h"

namespace tessera {

struct ListenerPorts {
  int api = 0;      // the OpenAI API listener (server.host)
  int admin = 0;    // the admin listener; = api when it is the API listener
  int control = 0;  // the control plane's ROUTER socket (server.control_endpoint)
  int store = 0;    // the rendezvous store workers meet at (Gloo)
};

// The JSON object above.
std::string ListenerPortsJson(const ListenerPorts& ports);

// The port of a bound ZeroMQ TCP endpoint "tcp://HOST:PORT" (ParseTcpEndpoint
// of common/net/endpoint.h). Errors: kInvalidArgument naming the endpoint
// and what is wrong with it (port 0: not bound).
StatusOr<int> EndpointPort(const std::string& endpoint);

// Writes ListenerPortsJson(ports) to `path` atomically (PATH.tmp, then
// rename). Errors: kIoError naming the file and the reason.
Status WritePortsFile(const std::string& path, const ListenerPorts& ports);

// Reads a file WritePortsFile wrote. Errors: kNotFound while it does not
// exist yet; kInvalidArgument naming the file when it is not such an object
// or a port is outside 1..65535.
StatusOr<ListenerPorts> ReadPortsFile(const std::string& path);

// The same for any JSON text (tessera-worker --ports-file writes
// {"metrics": N}: its metrics port, 0 when metrics are off).
Status WritePortsJson(const std::string& path, const std::string& json_text);

}  // namespace tessera
