// ConfigReader: typed access to one object of a Hugging Face config.json,
// shared by the parsers of common/format (model_config.cc and the family
// parsers beside it, e.g. gemma_config.cc). Not a public interface.
//
// Errors are reported as "<path>: key '<prefix><key>': ..." (kInvalidArgument).
// A key whose value is null counts as absent everywhere (HF writes null for
// "not set"); IsNull tells the two apart where a family's defaults need it.
//
// Thread-safety: a reader only reads the object it was given.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/base/json_parse.h"
#include "common/base/status.h"
#include "common/format/model_config.h"

namespace tessera::config_json {

using json = nlohmann::json;

// A short rendering of a JSON value for error messages.
inline std::string Show(const json& j) { return ShowJsonValue(j, 60); }

// Typed access to one JSON object (see the file comment), reporting errors as
// "<path>: key '<prefix><key>': ...". A key whose value is null counts as
// absent everywhere: HF writes null for "not set".
class ConfigReader {
 public:
  ConfigReader(const json& obj, const std::string& path, std::string prefix = "")
      : obj_(obj), path_(path), prefix_(std::move(prefix)) {}

  const json* Get(const std::string& key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool Has(const std::string& key) const { return Get(key) != nullptr; }
  // Whether the key is present with the value null (HF's "not set", which
  // some families distinguish from an absent key that takes a default).
  bool IsNull(const std::string& key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && it->is_null();
  }

  Status Error(const std::string& key, const std::string& what) const {
    return InvalidArgument(path_ + ": key '" + prefix_ + key + "': " + what);
  }
  Status Missing(const std::string& key) const {
    return InvalidArgument(path_ + ": missing required key '" + prefix_ + key + "'");
  }

  Status Int(const std::string& key, bool required, int64_t* out) const {
    const json* v = Get(key);
    if (v == nullptr) return required ? Missing(key) : Status::Ok();
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX})) {
      return Error(key, "expected an integer, got " + Show(*v));
    }
    *out = v->get<int64_t>();
    return Status::Ok();
  }
  // As Int, and the value must be in [1, 2^31 - 1]: sizes, counts and
  // positions, whose products (tensor shapes, byte counts) must fit int64.
  Status PositiveInt(const std::string& key, bool required, int64_t* out) const {
    TESSERA_RETURN_IF_ERROR(Int(key, required, out));
    if (Has(key) && *out <= 0) return Error(key, "must be positive, got " + std::to_string(*out));
    if (Has(key) && *out > INT32_MAX)
      return Error(key, "must be at most 2147483647, got " + std::to_string(*out));
    return Status::Ok();
  }
  Status Double(const std::string& key, bool required, double* out) const {
    const json* v = Get(key);
    if (v == nullptr) return required ? Missing(key) : Status::Ok();
    if (!v->is_number()) return Error(key, "expected a number, got " + Show(*v));
    *out = v->get<double>();
    return Status::Ok();
  }
  Status PositiveDouble(const std::string& key, bool required, double* out) const {
    TESSERA_RETURN_IF_ERROR(Double(key, required, out));
    if (Has(key) && !(*out > 0)) return Error(key, "must be positive, got " + Show(*Get(key)));
    return Status::Ok();
  }
  Status Bool(const std::string& key, bool* out) const {
    const json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Error(key, "expected true or false, got " + Show(*v));
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status String(const std::string& key, std::string* out) const {
    const json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_string()) return Error(key, "expected a string, got " + Show(*v));
    *out = v->get<std::string>();
    return Status::Ok();
  }
  // An int, a list of ints, or absent/null (-> empty).
  Status IntList(const std::string& key, std::vector<int64_t>* out) const {
    out->clear();
    const json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    const std::string expect = "expected an integer or a list of integers, got " + Show(*v);
    if (v->is_number_integer()) {
      out->push_back(v->get<int64_t>());
      return Status::Ok();
    }
    if (!v->is_array()) return Error(key, expect);
    for (const json& e : *v) {
      if (!e.is_number_integer()) return Error(key, expect);
      out->push_back(e.get<int64_t>());
    }
    return Status::Ok();
  }
  // An object or absent/null (-> nullptr).
  StatusOr<const json*> Object(const std::string& key) const {
    const json* v = Get(key);
    if (v != nullptr && !v->is_object()) return Error(key, "expected an object, got " + Show(*v));
    return v;
  }

 private:
  const json& obj_;
  const std::string& path_;
  std::string prefix_;
};

// Parses one rope_scaling / rope_parameters object (`key` names it in
// errors, e.g. "rope_scaling" or "rope_parameters.full_attention").
// `type_required`: whether a missing "rope_type"/"type" is an error
// (rope_scaling) or means default (rope_parameters). Longrope factor lists
// are read here and checked against head_dim by the caller.
Status ParseRope(const json& obj, const std::string& path, const std::string& key,
                 bool type_required, RopeScaling* out);

}  // namespace tessera::config_json
