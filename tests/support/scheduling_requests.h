// The requests the scheduling suites (leader_scheduling_test.cc,
// auto_leader_test.cc) send to a cluster scheduled by the coordinator and to
// one scheduled by each replica's leader, and each reply reduced to what must
// match between them. For the fixture model llama_gqa_f32 (chat template
// chatml, the DaemonCluster default).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

namespace tessera::testing {

// A greedy completion of `max_tokens` tokens that ignores EOS; prompt i is
// {5 + 7i, 17, 42}.
inline nlohmann::json Completion(int i, int max_tokens, bool stream) {
  return {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5 + 7 * i, 17, 42}},
          {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true},       {"stream", stream}};
}

// Greedy completions, a stop string, log-probabilities, n = 2 choices and a chat.
inline std::vector<nlohmann::json> ComparableRequests() {
  std::vector<nlohmann::json> r;
  for (int i = 0; i < 3; ++i) r.push_back(Completion(i, 24, false));
  nlohmann::json stop = Completion(3, 40, false);
  stop["prompt"] = "Hello there";
  stop["stop"] = {"a"};
  r.push_back(stop);
  nlohmann::json logprobs = Completion(4, 6, false);
  logprobs["logprobs"] = 2;
  r.push_back(logprobs);
  nlohmann::json choices = Completion(5, 8, false);
  choices["n"] = 2;
  r.push_back(choices);
  r.push_back({{"model", "llama_gqa_f32"},
               {"messages", {{{"role", "user"}, {"content", "Say something"}}}},
               {"max_tokens", 12},
               {"temperature", 0}});
  return r;
}

// A reply reduced to its choices' finish reasons, texts (or messages) and
// log-probabilities, and its usage.
inline nlohmann::json Essence(const nlohmann::json& reply) {
  nlohmann::json out = nlohmann::json::array();
  for (const nlohmann::json& c : reply["choices"]) {
    nlohmann::json e = {{"finish_reason", c["finish_reason"]}};
    if (c.contains("text")) e["text"] = c["text"];
    if (c.contains("message")) e["message"] = c["message"]["content"];
    if (c.contains("logprobs") && !c["logprobs"].is_null()) e["logprobs"] = c["logprobs"]["tokens"];
    out.push_back(e);
  }
  return {{"choices", out}, {"usage", reply["usage"]}};
}

}  // namespace tessera::testing
