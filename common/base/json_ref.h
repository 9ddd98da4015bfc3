// JsonRef: a read-only view of one node of a parsed JSON document that knows
// its file and JSON path, so that every error names both, e.g.
// "tokenizer.json: model.merges[12]: token 'ab' is not in model.vocab".
// Used by the tokenizer's loaders (tokenizer.json, tokenizer_config.json).
//
// Thread-safety: a view over an immutable document; safe to copy and read
// from many threads while the document outlives it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tessera {

class JsonRef {
 public:
  JsonRef(const nlohmann::json& node, std::string file, std::string path)
      : node_(&node), file_(std::move(file)), path_(std::move(path)) {}

  const nlohmann::json& node() const { return *node_; }
  const std::string& file() const { return file_; }
  // "model.merges[3]"; "(root)" for the document itself.
  std::string path() const { return path_.empty() ? "(root)" : path_; }

  bool is_null() const { return node_->is_null(); }
  // True when this is an object holding `key` with a non-null value.
  bool Has(std::string_view key) const;

  // The child `key`; kInvalidArgument when this is not an object or the key
  // is missing or null.
  StatusOr<JsonRef> Required(std::string_view key) const;
  // The child `key` (possibly a JSON null when absent; `Has` tells).
  JsonRef Child(std::string_view key) const;
  // Element `i` of an array (precondition: is an array with size > i).
  JsonRef At(size_t i) const;

  // Typed reads of this node; kInvalidArgument naming the path on type mismatch.
  StatusOr<std::string> AsString() const;
  StatusOr<bool> AsBool() const;
  StatusOr<int64_t> AsInt() const;
  StatusOr<double> AsNumber() const;
  // Type checks that return the same error shape.
  Status ExpectObject() const;
  Status ExpectArray() const;

  // Typed reads of a member: required (missing → error) or with a default
  // used when the member is absent or null.
  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<std::string> GetStringOr(std::string_view key, std::string_view fallback) const;
  StatusOr<bool> GetBoolOr(std::string_view key, bool fallback) const;
  StatusOr<int64_t> GetIntOr(std::string_view key, int64_t fallback) const;

  // kInvalidArgument "file: path: message".
  Status Error(std::string_view message) const;
  // kUnimplemented "file: path: unsupported <what> '<value>'; supported: <supported>".
  Status Unsupported(std::string_view what, std::string_view value,
                     std::string_view supported) const;

 private:
  std::string ChildPath(std::string_view key) const;

  const nlohmann::json* node_;
  std::string file_;
  std::string path_;
};

// Parses `text` (contents of `file`). Errors: kInvalidArgument naming the file
// and the parser's byte position.
StatusOr<nlohmann::json> ParseJsonDocument(std::string_view text, const std::string& file);

}  // namespace tessera
