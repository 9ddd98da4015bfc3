// The requests the scheduling suites (leader_scheduling_test.cc,
// auto_leader_test.cc) send to a cluster scheduled by the coordinator and to
// one scheduled by each replica's leader, and each reply reduced to what must
// match between them. For the fixture model llama_gqa_f32 (chat template
// chatml, the DaemonCluster default).
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/net/http_client.h"
#include "support/raw_sse_stream.h"

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

// The calls both suites make to the cluster's API on port_, mixed into their fixtures: admin
// GETs with kAdminToken (the token the suites' clusters are started with), whole answers reduced
// to their Essence, and a streamed completion's text. Failures are gtest expectations.
class SchedulingApi {
 public:
  static constexpr const char* kAdminToken = "s3cret";

 protected:
  nlohmann::json Get(const std::string& path) const {
    auto r = HttpCall(port_, "GET", path, "", kAdminToken);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return nlohmann::json::parse(r.body, nullptr, false);
  }
  nlohmann::json Answer(const nlohmann::json& request) const {
    const std::string path =
        request.contains("messages") ? "/v1/chat/completions" : "/v1/completions";
    auto r = HttpCall(port_, "POST", path, request.dump());
    EXPECT_EQ(r.status, 200) << request.dump() << "\n" << r.body;
    const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    return j.is_discarded() || !j.contains("choices") ? nlohmann::json() : Essence(j);
  }
  // A streamed completion's text, read whole.
  std::string StreamText(const nlohmann::json& request) const {
    RawSseStream s;
    s.Run(port_, request.dump());
    EXPECT_EQ(s.error, "");
    EXPECT_EQ(s.done_markers, 1);
    return s.text;
  }

  int port_ = 0;  // the cluster's API port, set by the fixture once it started
};

}  // namespace tessera::testing
