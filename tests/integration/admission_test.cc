// Admission through the real daemons (a coordinator and one worker): a
// request that can never fit the queue is a 400 naming the key, takes no
// queue slot and counts once as rejected, never as cancelled; an empty
// prompt is a 400 with its param and code (issue #16 item 5 and 6).
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/net/http_client.h"
#include "support/daemons_fixture.h"

namespace tessera {
namespace {

using nlohmann::json;

class AdmissionDaemons : public Daemons {
 protected:
  ::tessera::testing::DaemonClusterOptions Options() const override {
    auto o = Daemons::Options();
    o.parallel_toml = "tp = 1\npp = 1\n";
    o.workers = 1;
    o.scheduler_toml = "max_context = 128\nqueue_limit = 4\nmax_sequences = 2\n";
    return o;
  }

  // The value of tessera_requests_total{status="<status>"} on /metrics.
  double RequestsTotal(const std::string& status) {
    const HttpReply m = HttpCall(port_, "GET", "/metrics");
    EXPECT_EQ(m.status, 200);
    const std::regex line("tessera_requests_total\\{status=\"" + status + "\"\\} ([0-9.e+]+)");
    std::smatch match;
    if (!std::regex_search(m.body, match, line)) {
      ADD_FAILURE() << "no tessera_requests_total{status=\"" << status << "\"} in /metrics";
      return -1;
    }
    return std::stod(match[1]);
  }
};

TEST_F(AdmissionDaemons, MorePromptsThanTheQueueHoldsIs400AndTakesNoSlot) {
  const json too_many = {{"model", "llama_gqa_f32"},
                         {"prompt", {"a", "b", "c", "d", "e"}},  // 5 > queue_limit 4
                         {"max_tokens", 2}};
  const double cancelled_before = RequestsTotal("cancelled");
  const double rejected_before = RequestsTotal("rejected");
  const HttpReply r = HttpCall(port_, "POST", "/v1/completions", too_many.dump());
  ASSERT_EQ(r.status, 400) << r.body;
  const json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "prompt") << r.body;
  EXPECT_EQ(e["code"], "too_many_prompts") << r.body;
  EXPECT_NE(e["message"].get<std::string>().find("scheduler.queue_limit"), std::string::npos);
  EXPECT_EQ(RequestsTotal("cancelled"), cancelled_before);
  EXPECT_EQ(RequestsTotal("rejected"), rejected_before + 1);

  // While one client repeats it, normal requests (two at a time: within the
  // queue's four places) are all served: the refused request never holds
  // places, not even briefly.
  std::atomic<bool> stop{false};
  std::atomic<int> refused{0};
  std::thread attacker([&] {
    for (int i = 0; i < 200 && !stop.load(); ++i)
      if (HttpCall(port_, "POST", "/v1/completions", too_many.dump()).status == 400) ++refused;
  });
  std::vector<int> statuses(16, 0);
  for (int round = 0; round < 8; ++round) {
    std::vector<std::thread> clients;
    for (int c = 0; c < 2; ++c) {
      clients.emplace_back([&, round, c] {
        const json req = {{"model", "llama_gqa_f32"},
                          {"prompt", std::vector<int>{5 + round, 17, 42 + c}},
                          {"max_tokens", 4},
                          {"temperature", 0},
                          {"ignore_eos", true}};
        statuses[static_cast<size_t>(round * 2 + c)] =
            HttpCall(port_, "POST", "/v1/completions", req.dump()).status;
      });
    }
    for (auto& t : clients) t.join();
  }
  stop = true;
  attacker.join();
  for (size_t i = 0; i < statuses.size(); ++i) EXPECT_EQ(statuses[i], 200) << "request " << i;
  EXPECT_GE(refused.load(), 1);
  EXPECT_EQ(RequestsTotal("cancelled"), cancelled_before);
}

// Empty prompt arrays, and text that tokenizes to nothing (this model's
// tokenizer adds no BOS token), are each a 400 naming prompt, code
// empty_prompt.
class NoBosDaemons : public AdmissionDaemons {
 protected:
  std::string ModelName() const override { return "qwen2_bias_f16"; }
};

TEST_F(NoBosDaemons, AnEmptyPromptIs400WithParamAndCode) {
  const std::string m = "\"model\":\"qwen2_bias_f16\"";
  for (const std::string& body :
       {"{" + m + ",\"prompt\":\"\"}", "{" + m + ",\"prompt\":[\"x\",\"\"]}",
        "{" + m + ",\"prompt\":[]}", "{" + m + ",\"prompt\":[[1],[]]}"}) {
    const HttpReply r = HttpCall(port_, "POST", "/v1/completions", body);
    ASSERT_EQ(r.status, 400) << body << ": " << r.body;
    const json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], "prompt") << body << ": " << r.body;
    EXPECT_EQ(e["code"], "empty_prompt") << body << ": " << r.body;
    EXPECT_EQ(e["type"], "invalid_request_error") << r.body;
  }
  const HttpReply ok =
      HttpCall(port_, "POST", "/v1/completions", "{" + m + ",\"prompt\":\"x\",\"max_tokens\":2}");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

}  // namespace
}  // namespace tessera
