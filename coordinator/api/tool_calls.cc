#include "coordinator/api/tool_calls.h"

#include <fmt/format.h>

#include <set>

#include "common/base/json_parse.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using MaybeError = std::optional<ApiError>;

ApiError Bad(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string Show(const json& j) { return ShowJsonValue(j, 40); }

// The checks a JSON Schema object must pass here (LLGuidance compiles it in
// the frontend): "type" a JSON type or an array of them, "properties" an
// object of schemas, "required" an array of strings; recursively through
// properties and items.
MaybeError CheckSchema(const json& s, const std::string& param, const std::string& at, int depth) {
  if (s.is_boolean()) return std::nullopt;
  if (!s.is_object())
    return Bad(fmt::format("{}: {} must be a JSON Schema object, got {}", param, at, Show(s)),
               param);
  if (depth > 32) return Bad(param + ": the schema nests too deep", param);
  static const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                               "integer", "boolean", "null"};
  if (const json* t = Find(s, "type")) {
    std::vector<json> types = t->is_array() ? t->get<std::vector<json>>() : std::vector<json>{*t};
    for (const json& one : types)
      if (!one.is_string() || !kTypes.count(one.get<std::string>()))
        return Bad(fmt::format("{}: {}.type {} is not a JSON Schema type (object, array, string, "
                               "number, integer, boolean, null)",
                               param, at, Show(*t)),
                   param);
  }
  if (const json* p = Find(s, "properties")) {
    if (!p->is_object())
      return Bad(fmt::format("{}: {}.properties must be an object of schemas", param, at), param);
    for (const auto& [key, sub] : p->items())
      if (auto e = CheckSchema(sub, param, at + ".properties." + key, depth + 1)) return e;
  }
  if (const json* r = Find(s, "required")) {
    bool ok = r->is_array();
    for (size_t i = 0; ok && i < r->size(); ++i) ok = (*r)[i].is_string();
    if (!ok)
      return Bad(fmt::format("{}: {}.required must be an array of property names", param, at),
                 param);
  }
  if (const json* items = Find(s, "items"))
    if (auto e = CheckSchema(*items, param, at + ".items", depth + 1)) return e;
  return std::nullopt;
}

// One function definition {"name", "description", "parameters"} at `at`
// (tools[i].function or functions[i]).
MaybeError GetFunction(const json& f, const std::string& at, ToolFunction* out) {
  if (!f.is_object()) return Bad(fmt::format("{} must be an object, got {}", at, Show(f)), at);
  const json* name = Find(f, "name");
  if (!name) return Bad(at + ".name is required", at + ".name");
  if (!name->is_string() || !IsValidApiName(name->get_ref<const std::string&>()))
    return Bad(fmt::format("{}.name must be a string of 1 to 64 letters, digits, _ or -, got {}",
                           at, Show(*name)),
               at + ".name");
  out->name = name->get<std::string>();
  if (const json* d = Find(f, "description"); d && !d->is_string())
    return Bad(at + ".description must be a string", at + ".description");
  if (const json* s = Find(f, "strict"); s && !s->is_boolean())
    return Bad(at + ".strict must be a boolean", at + ".strict");
  const json* params = Find(f, "parameters");
  out->parameters = params ? *params : json{{"type", "object"}, {"properties", json::object()}};
  return CheckSchema(out->parameters, at + ".parameters", "the schema", 0);
}

MaybeError GetToolList(const json& obj, std::string_view body, ToolsRequest* out) {
  const json* tools = Find(obj, "tools");
  const json* functions = Find(obj, "functions");
  if (tools && functions) return Bad("give tools or the legacy functions, not both", "functions");
  if (!tools && !functions) return std::nullopt;
  const char* key = tools ? "tools" : "functions";
  const json& list = tools ? *tools : *functions;
  if (!list.is_array())
    return Bad(fmt::format("{} must be an array, got {}", key, Show(list)), key);
  if (list.size() > kMaxTools)
    return Bad(fmt::format("{} may hold at most {} functions, got {}", key, kMaxTools, list.size()),
               key);
  const ordered_json ordered = OrderedMember(body, key);
  out->legacy = functions != nullptr;
  out->tools_json = ordered_json::array();
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    const std::string at = tools ? fmt::format("tools[{}]", i) : fmt::format("functions[{}]", i);
    ToolFunction f;
    if (tools) {
      if (!t.is_object()) return Bad(fmt::format("{} must be an object, got {}", at, Show(t)), at);
      const json* type = Find(t, "type");
      if (!type || *type != "function") return Bad(at + ".type must be \"function\"", at + ".type");
      const json* fn = Find(t, "function");
      if (!fn) return Bad(at + ".function is required", at + ".function");
      if (auto e = GetFunction(*fn, at + ".function", &f)) return e;
      out->tools_json.push_back(ordered[i]);
    } else {
      if (auto e = GetFunction(t, at, &f)) return e;
      out->tools_json.push_back({{"type", "function"}, {"function", ordered[i]}});
    }
    if (!names.insert(f.name).second)
      return Bad(fmt::format("{}: the function name '{}' is given twice", at, f.name),
                 tools ? at + ".function.name" : at + ".name");
    out->functions.push_back(std::move(f));
  }
  if (out->functions.empty()) out->tools_json = nullptr;  // [] is no tools
  return std::nullopt;
}

MaybeError GetChoice(const json& obj, ToolsRequest* out) {
  const json* choice = Find(obj, "tool_choice");
  const char* key = "tool_choice";
  if (!choice && (choice = Find(obj, "function_call"))) key = "function_call";
  out->choice = out->functions.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (!choice) return std::nullopt;
  const std::string field = key;
  if (choice->is_string()) {
    const std::string& s = choice->get_ref<const std::string&>();
    if (s == "none") {
      out->choice = ToolChoice::kNone;
      return std::nullopt;
    }
    if (s != "auto" && !(s == "required" && field == "tool_choice"))
      return Bad(fmt::format("{} '{}' is not one of none, auto, required or {{\"type\": "
                             "\"function\", \"function\": {{\"name\": ...}}}}",
                             field, s),
                 field);
    out->choice = s == "auto" ? ToolChoice::kAuto : ToolChoice::kRequired;
  } else if (choice->is_object()) {
    const json* fn = field == "tool_choice" ? Find(*choice, "function") : choice;
    if (field == "tool_choice") {
      const json* type = Find(*choice, "type");
      if (!type || *type != "function")
        return Bad("tool_choice.type must be \"function\"", "tool_choice.type");
    }
    const json* name = fn && fn->is_object() ? Find(*fn, "name") : nullptr;
    const std::string at =
        field == "tool_choice" ? "tool_choice.function.name" : "function_call.name";
    if (!name || !name->is_string()) return Bad(at + " must be a string", at);
    out->named = name->get<std::string>();
    out->choice = ToolChoice::kNamed;
    bool known = false;
    for (const ToolFunction& f : out->functions) known = known || f.name == out->named;
    if (!known)
      return Bad(fmt::format("{} '{}' is not a function in {}", at, out->named.substr(0, 64),
                             out->legacy ? "functions" : "tools"),
                 at);
  } else {
    return Bad(fmt::format("{} must be a string or an object, got {}", field, Show(*choice)),
               field);
  }
  if (out->functions.empty())
    return Bad(fmt::format("{} requires tools: the request lists no function", field), field);
  return std::nullopt;
}

}  // namespace

MaybeError GetTools(const json& obj, std::string_view body, ToolsRequest* out) {
  *out = ToolsRequest{};
  if (auto e = GetToolList(obj, body, out)) return e;
  if (auto e = GetChoice(obj, out)) return e;
  if (const json* p = Find(obj, "parallel_tool_calls")) {
    if (!p->is_boolean())
      return Bad(fmt::format("parallel_tool_calls must be a boolean, got {}", Show(*p)),
                 "parallel_tool_calls");
    out->parallel = p->get<bool>();
  }
  if (out->legacy) out->parallel = false;  // function_call answers one call
  return std::nullopt;
}

MaybeError GetMessageToolFields(const json& m, const std::string& name, ChatMessage* msg) {
  if (msg->role == "function") msg->role = "tool";  // legacy function results
  msg->extra = ordered_json::object();
  if (msg->role == "tool") {
    const json* id = Find(m, "tool_call_id");
    if (id && !id->is_string())
      return Bad(name + ".tool_call_id must be a string", name + ".tool_call_id");
    if (!id && !Find(m, "name"))
      return Bad(name + ".tool_call_id is required in a tool message", name + ".tool_call_id");
    if (id) msg->extra["tool_call_id"] = id->get<std::string>();
  }
  if (const json* n = Find(m, "name")) {
    if (!n->is_string()) return Bad(name + ".name must be a string", name + ".name");
    msg->extra["name"] = n->get<std::string>();
  }
  const json* calls = Find(m, "tool_calls");
  if (!calls) return std::nullopt;
  if (msg->role != "assistant")
    return Bad(name + ".tool_calls is only allowed in assistant messages", name + ".tool_calls");
  if (!calls->is_array()) return Bad(name + ".tool_calls must be an array", name + ".tool_calls");
  ordered_json out = ordered_json::array();
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string at = fmt::format("{}.tool_calls[{}]", name, k);
    if (!c.is_object()) return Bad(at + " must be an object", at);
    const json* id = Find(c, "id");
    if (!id || !id->is_string()) return Bad(at + ".id must be a string", at + ".id");
    const json* fn = Find(c, "function");
    if (!fn || !fn->is_object()) return Bad(at + ".function must be an object", at + ".function");
    const json* fname = Find(*fn, "name");
    if (!fname || !fname->is_string())
      return Bad(at + ".function.name must be a string", at + ".function.name");
    const json* args = Find(*fn, "arguments");
    if (!args || !args->is_string())
      return Bad(at + ".function.arguments must be a string of JSON", at + ".function.arguments");
    ordered_json parsed = ordered_json::parse(args->get<std::string>(), nullptr, false);
    if (parsed.is_discarded())
      return Bad(at + ".function.arguments is not valid JSON", at + ".function.arguments");
    out.push_back({{"id", id->get<std::string>()},
                   {"type", "function"},
                   {"function", {{"name", fname->get<std::string>()}, {"arguments", parsed}}}});
  }
  msg->extra["tool_calls"] = std::move(out);
  return std::nullopt;
}

}  // namespace tessera
