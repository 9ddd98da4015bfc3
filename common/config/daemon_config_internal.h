// Internals of the daemon config shared by its files (not a public API):
// daemon_config_keys.cc (the table of every key, how each is read from TOML
// and written back, and the messages for values of the wrong type),
// daemon_config_validate.cc (the checks of ValidateDaemonConfig and the
// helpers naming where a key was set) and daemon_config.cc (parsing a file,
// --set overrides, formatting). Include only from common/config/*.cc.
//
// Thread-safety: the key table is built once (function-local statics);
// everything else is pure functions.
#pragma once

#include <toml++/toml.h>

#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/config/daemon_config.h"
#include "common/net/endpoint.h"

namespace tessera::config_internal {

// ---------------------------------------------------------------------------
// Keys (daemon_config_keys.cc).

// "path:line:column" of a TOML source region.
std::string Loc(const toml::source_region& r, const std::string& path);
// A TOML basic string literal for `s` (always double-quoted, escaped).
std::string Quote(const std::string& s);
// "integer 0", "string \"64\"", "array [1, 2]", "a table".
std::string Show(const toml::node& n);
// Shortest round-trip form of a double that TOML reads back as a float.
std::string FormatDouble(double d);
// kInvalidArgument "WHERE: KEY: WHAT".
Status KeyError(const std::string& where, const std::string& key, const std::string& what);

// Where a node came from: a file location, or the --set flag for overrides.
using Locator = std::function<std::string(const toml::node&)>;

// One key of the config: how to read it from a TOML node and write it back.
struct Field {
  std::string table;
  std::string key;
  std::string expected;  // "an integer", "a string", ... for messages
  bool is_string;        // overrides take the value verbatim
  // Reads `node` into the config. `key` is "table.key".
  std::function<Status(DaemonConfig&, const toml::node&, const Locator&)> set;
  // The current value as a TOML literal.
  std::function<std::string(const DaemonConfig&)> format;

  std::string path() const { return table + "." + key; }
};

// Tables in file order; every key, tables in that order and keys in
// declaration order.
const std::vector<std::string>& Tables();
const std::vector<Field>& Fields();
bool IsTable(const std::string& table);
// The field `table.key`, or null.
const Field* FindField(const std::string& table, const std::string& key);
// "unknown table 'x'; did you mean ...; valid tables: ...".
std::string UnknownTableMessage(const std::string& table);
// "unknown key; did you mean ...; valid keys of [t]: ...".
std::string UnknownKeyMessage(const std::string& table, const std::string& key);

// ---------------------------------------------------------------------------
// Validation helpers (daemon_config_validate.cc).

// Every address `host` stands for is loopback (common/net/host_address.h).
bool IsLoopback(const std::string& host);
// "*", "0.0.0.0", "::", "[::]" (common/net/endpoint.h).
bool IsWildcard(const std::string& host);
// "" when `endpoint` parses for `use` (into *host, brackets removed, and
// *port), else what is wrong (ParseTcpEndpoint's message).
std::string ParseEndpoint(const std::string& endpoint, EndpointUse use, std::string* host,
                          int* port);
// RFC 6750 b64token.
bool IsBearerToken(const std::string& token);
// Where `key` was set: its source, else the file, else "(defaults)".
std::string Where(const DaemonConfig& c, const std::string& key);
// Whether `key` was given (in the file or by --set).
bool IsSet(const DaemonConfig& c, const std::string& key);
// kInvalidArgument "WHERE: KEY: WHAT" for `key` of `c`.
Status Bad(const DaemonConfig& c, const std::string& key, const std::string& what);

}  // namespace tessera::config_internal
