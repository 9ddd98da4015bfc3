#include "common/base/json_ref.h"

#include <fmt/format.h>

namespace tessera {

namespace {
const nlohmann::json& NullJson() {
  static const nlohmann::json* kNull = new nlohmann::json(nullptr);
  return *kNull;
}

const char* TypeName(const nlohmann::json& j) { return j.type_name(); }
}  // namespace

std::string JsonRef::ChildPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

bool JsonRef::Has(std::string_view key) const {
  if (!node_->is_object()) return false;
  auto it = node_->find(key);
  return it != node_->end() && !it->is_null();
}

StatusOr<JsonRef> JsonRef::Required(std::string_view key) const {
  if (!node_->is_object()) {
    return Error(fmt::format("expected an object holding '{}', found {}", key, TypeName(*node_)));
  }
  auto it = node_->find(key);
  if (it == node_->end() || it->is_null()) {
    return InvalidArgument(fmt::format("{}: {}: required key is missing", file_, ChildPath(key)));
  }
  return JsonRef(*it, file_, ChildPath(key));
}

JsonRef JsonRef::Child(std::string_view key) const {
  if (node_->is_object()) {
    auto it = node_->find(key);
    if (it != node_->end()) return JsonRef(*it, file_, ChildPath(key));
  }
  return JsonRef(NullJson(), file_, ChildPath(key));
}

JsonRef JsonRef::At(size_t i) const {
  TESSERA_CHECK(node_->is_array() && i < node_->size());
  return JsonRef((*node_)[i], file_, fmt::format("{}[{}]", path_, i));
}

StatusOr<std::string> JsonRef::AsString() const {
  if (!node_->is_string())
    return Error(fmt::format("expected a string, found {}", TypeName(*node_)));
  return node_->get<std::string>();
}

StatusOr<bool> JsonRef::AsBool() const {
  if (!node_->is_boolean())
    return Error(fmt::format("expected a boolean, found {}", TypeName(*node_)));
  return node_->get<bool>();
}

StatusOr<int64_t> JsonRef::AsInt() const {
  if (!node_->is_number_integer()) {
    return Error(fmt::format("expected an integer, found {}", TypeName(*node_)));
  }
  return node_->get<int64_t>();
}

StatusOr<double> JsonRef::AsNumber() const {
  if (!node_->is_number())
    return Error(fmt::format("expected a number, found {}", TypeName(*node_)));
  return node_->get<double>();
}

Status JsonRef::ExpectObject() const {
  if (!node_->is_object())
    return Error(fmt::format("expected an object, found {}", TypeName(*node_)));
  return Status::Ok();
}

Status JsonRef::ExpectArray() const {
  if (!node_->is_array())
    return Error(fmt::format("expected an array, found {}", TypeName(*node_)));
  return Status::Ok();
}

StatusOr<std::string> JsonRef::GetString(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(JsonRef child, Required(key));
  return child.AsString();
}

StatusOr<std::string> JsonRef::GetStringOr(std::string_view key, std::string_view fallback) const {
  if (!Has(key)) return std::string(fallback);
  return Child(key).AsString();
}

StatusOr<bool> JsonRef::GetBoolOr(std::string_view key, bool fallback) const {
  if (!Has(key)) return fallback;
  return Child(key).AsBool();
}

StatusOr<int64_t> JsonRef::GetIntOr(std::string_view key, int64_t fallback) const {
  if (!Has(key)) return fallback;
  return Child(key).AsInt();
}

Status JsonRef::Error(std::string_view message) const {
  return InvalidArgument(fmt::format("{}: {}: {}", file_, path(), message));
}

Status JsonRef::Unsupported(std::string_view what, std::string_view value,
                            std::string_view supported) const {
  return Unimplemented(fmt::format("{}: {}: unsupported {} '{}'; supported: {}", file_, path(),
                                   what, value, supported));
}

StatusOr<nlohmann::json> ParseJsonDocument(std::string_view text, const std::string& file) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return InvalidArgument(
        fmt::format("{}: malformed JSON at byte {}: {}", file, e.byte, e.what()));
  }
}

}  // namespace tessera
