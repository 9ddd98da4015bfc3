#include "common/config/daemon_config.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>

#include "common/base/quote.h"
#include "common/config/daemon_config_internal.h"
#include "common/net/endpoint.h"

namespace tessera {

using namespace config_internal;  // NOLINT: the shared internals of the config files

namespace {

// The keys of an explicit layout: setting one with no mode named selects
// "explicit"; "auto" mode takes none of them.
constexpr const char* kExplicitLayoutKeys[] = {
    "parallel.tp", "parallel.pp", "parallel.layers_per_stage", "parallel.replica_override"};

// In "auto" mode with no mode named, setting tp, pp, layers_per_stage or
// replica_override selects "explicit".
void InferParallelMode(DaemonConfig& c) {
  if (IsSet(c, "parallel.mode")) return;
  if (std::any_of(std::begin(kExplicitLayoutKeys), std::end(kExplicitLayoutKeys),
                  [&c](const char* key) { return IsSet(c, key); })) {
    c.parallel.mode = ParallelMode::kExplicit;
  }
}

// worker.coordinator, when not set, follows a loopback or wildcard
// server.control_endpoint, so one file with a moved control port still
// connects the workers of that machine (a wildcard becomes 127.0.0.1). A
// control endpoint on another address is left alone: workers elsewhere name
// their route to it themselves, with CURVE keys.
void InferWorkerCoordinator(DaemonConfig& c) {
  if (IsSet(c, "worker.coordinator") || !IsSet(c, "server.control_endpoint")) return;
  std::string host;
  int port = 0;
  if (!ParseEndpoint(c.server.control_endpoint, EndpointUse::kBind, &host, &port).empty()) return;
  if (port == 0) return;  // picked when the coordinator binds: workers are told it
  if (IsWildcard(host)) host = "127.0.0.1";
  if (!IsLoopback(host)) return;
  c.worker.coordinator = FormatTcpEndpoint(host, port);
}

std::string Trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Reads the regular file `file` into `*text`; on failure returns why
// ("cannot read \"f\": No such file or directory"), else "".
std::string ReadRegularFile(const std::string& file, std::string* text) {
  // Token, certificate and key files are small; a device or a FIFO (e.g.
  // "/dev/zero") would never end.
  constexpr uintmax_t kMaxBytes = 1 << 20;
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) return Quote(file) + " is a directory";
  const auto status = std::filesystem::status(file, ec);
  if (!ec && status.type() != std::filesystem::file_type::regular)
    return Quote(file) + " is not a regular file";
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (!ec && size > kMaxBytes)
    return Quote(file) + fmt::format(" has {} bytes; the limit is {}", size, kMaxBytes);
  std::ifstream in(file, std::ios::binary);
  if (!in) return "cannot read " + Quote(file) + ": " + std::strerror(errno);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return "cannot read " + Quote(file);
  *text = ss.str();
  return "";
}

// Reads admin.token_file into admin.effective_token and checks that the TLS
// files can be read.
Status ResolveFiles(DaemonConfig& c) {
  c.admin.effective_token = c.admin.token;
  if (!c.admin.token_file.empty()) {
    const std::string& file = c.admin.token_file;
    std::string text;
    std::string why = ReadRegularFile(file, &text);
    if (!why.empty()) return Bad(c, "admin.token_file", why);
    std::string token = Trim(text);
    if (token.empty()) return Bad(c, "admin.token_file", Quote(file) + " is empty");
    if (!IsBearerToken(token)) {
      return Bad(c, "admin.token_file",
                 Quote(file) +
                     " does not hold a bearer token (letters, digits, - . _ ~ + / and trailing =)");
    }
    // Like a CURVE secret key file: a secret others on the host may read is
    // no secret.
    struct stat st;
    if (stat(file.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      return Bad(c, "admin.token_file",
                 Quote(file) + fmt::format(" is accessible by group or others (mode {:04o}); "
                                           "chmod 600 it (owner read/write only)",
                                           st.st_mode & 07777));
    }
    c.admin.effective_token = token;
  }
  for (const char* key : {"server.tls_cert", "server.tls_key"}) {
    const std::string& file =
        std::string(key) == "server.tls_cert" ? c.server.tls_cert : c.server.tls_key;
    if (file.empty()) continue;
    std::string text;
    std::string why = ReadRegularFile(file, &text);
    if (!why.empty()) return Bad(c, key, why);
  }
  return Status::Ok();
}

Status Finish(DaemonConfig& c) {
  TESSERA_RETURN_IF_ERROR(ValidateDaemonConfig(c));
  return ResolveFiles(c);
}

// Sets `table.key` = `value` from a --set flag on `c` (not validated).
Status SetOne(DaemonConfig& c, const std::string& dotted_key, const std::string& value) {
  const std::string flag = "--set " + dotted_key + "=" + value;
  size_t dot = dotted_key.find('.');
  std::string table = dotted_key.substr(0, dot);
  if (!IsTable(table)) return InvalidArgument(flag + ": " + UnknownTableMessage(table));
  if (dot == std::string::npos) {
    return InvalidArgument(flag + ": " + table + ": expected table.key, got the table alone");
  }
  std::string key = dotted_key.substr(dot + 1);
  const Field* f = FindField(table, key);
  if (f == nullptr) return KeyError(flag, dotted_key, UnknownKeyMessage(table, key));
  Locator loc = [&flag](const toml::node&) { return flag; };
  if (f->is_string) {
    TESSERA_RETURN_IF_ERROR(f->set(c, toml::value<std::string>(value), loc));
  } else {
    toml::table doc;
    try {
      doc = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      return KeyError(flag, dotted_key, "expected " + f->expected + ", got " + Quote(value));
    }
    if (doc.size() != 1) {
      return KeyError(flag, dotted_key, "expected " + f->expected + ", got " + Quote(value));
    }
    TESSERA_RETURN_IF_ERROR(f->set(c, *doc.get("v"), loc));
  }
  c.sources[dotted_key] = flag;
  if (dotted_key == "parallel.mode" && c.parallel.mode == ParallelMode::kAuto) {
    c.parallel.tp = 1;
    c.parallel.tp_per_stage.clear();
    c.parallel.pp = 1;
    c.parallel.layers_per_stage.clear();
    c.parallel.replica_overrides.clear();
    for (const char* k : kExplicitLayoutKeys) c.sources.erase(k);
    const std::string entries = "parallel.replica_override[";
    for (auto it = c.sources.lower_bound(entries);
         it != c.sources.end() && it->first.rfind(entries, 0) == 0;)
      it = c.sources.erase(it);
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------

std::string ConfigKeyContext(const DaemonConfig& config, const std::string& key) {
  return Where(config, key) + ": " + key;
}

std::string ServedModelName(const ModelSection& model) {
  if (!model.name.empty()) return model.name;
  std::filesystem::path p(model.path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "models/x/" -> "models/x"
  std::string name = p.filename().string();
  return name.empty() ? model.path : name;
}

StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound(path + ": config file does not exist");
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path + ": cannot open config file: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path + ": cannot read config file");
  return ParseDaemonConfig(ss.str(), path);
}

StatusOr<DaemonConfig> ParseDaemonConfig(const std::string& text, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return InvalidArgument(Loc(e.source(), path) +
                           ": TOML syntax error: " + std::string(e.description()));
  }
  DaemonConfig c;
  c.path = path;
  Locator loc = [&path](const toml::node& n) { return Loc(n.source(), path); };
  for (auto&& [tkey, tnode] : root) {
    std::string table(tkey.str());
    if (!IsTable(table))
      return InvalidArgument(Loc(tkey.source(), path) + ": " + UnknownTableMessage(table));
    if (!tnode.is_table())
      return KeyError(loc(tnode), table, "expected a table, got " + Show(tnode));
    for (auto&& [key, node] : *tnode.as_table()) {
      std::string name(key.str());
      const Field* f = FindField(table, name);
      if (f == nullptr) {
        return KeyError(Loc(key.source(), path), table + "." + name,
                        UnknownKeyMessage(table, name));
      }
      TESSERA_RETURN_IF_ERROR(f->set(c, node, loc));
      c.sources[f->path()] = loc(node);
    }
  }
  InferParallelMode(c);
  InferWorkerCoordinator(c);
  TESSERA_RETURN_IF_ERROR(Finish(c));
  return c;
}

Status ApplyOverride(DaemonConfig& config, const std::string& dotted_key,
                     const std::string& value) {
  return ApplyOverrides(config, {dotted_key + "=" + value});
}

Status ApplyOverrides(DaemonConfig& config, const std::vector<std::string>& assignments) {
  DaemonConfig c = config;
  for (const std::string& a : assignments) {
    size_t eq = a.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--set " + a + ": expected table.key=value");
    }
    TESSERA_RETURN_IF_ERROR(SetOne(c, Trim(a.substr(0, eq)), a.substr(eq + 1)));
  }
  InferParallelMode(c);
  InferWorkerCoordinator(c);
  TESSERA_RETURN_IF_ERROR(Finish(c));
  config = std::move(c);
  return Status::Ok();
}

std::string FormatDaemonConfig(const DaemonConfig& config, bool redact_secrets) {
  std::string out;
  for (const std::string& table : Tables()) {
    out += (out.empty() ? "[" : "\n[") + table + "]\n";
    for (const Field& f : Fields()) {
      if (f.table != table) continue;
      const std::string path = f.path();
      if (config.parallel.mode == ParallelMode::kAuto &&
          std::find(std::begin(kExplicitLayoutKeys), std::end(kExplicitLayoutKeys), path) !=
              std::end(kExplicitLayoutKeys)) {
        continue;
      }
      std::string value = f.format(config);
      if (path == "admin.token" && redact_secrets && !config.admin.token.empty())
        value = "\"<redacted>\"";
      out += f.key + " = " + value + "\n";
    }
  }
  return out;
}

}  // namespace tessera
