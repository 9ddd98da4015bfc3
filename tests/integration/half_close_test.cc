// A client that half-closes (shutdown(SHUT_WR)) after sending its request to
// the coordinator's OpenAI API is served, streamed or not, with the tokens a
// client that keeps its connection open gets (it once got 200 headers and a
// close, or 0 bytes: the EOF was taken for a disconnect). Real daemons on
// loopback (tp=2 x pp=2).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/net/http_client.h"
#include "support/daemons_fixture.h"
#include "support/raw_http_client.h"

namespace tessera {
namespace {

using nlohmann::json;
using Client = ::tessera::testing::RawHttpClient;

json Body(bool stream) {
  return {{"model", "llama_gqa_f32"}, {"prompt", std::vector<int>{5, 17, 42}},
          {"max_tokens", 12},         {"temperature", 0},
          {"ignore_eos", true},       {"stream", stream}};
}

std::string Request(const json& body) {
  const std::string text = body.dump();
  return "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(text.size()) + "\r\n\r\n" + text;
}

TEST_F(Daemons, AHalfClosedClientIsServedWholeAndStreamed) {
  const HttpReply reference = HttpCall(port_, "POST", "/v1/completions", Body(false).dump());
  ASSERT_EQ(reference.status, 200) << reference.body;
  const std::string want = json::parse(reference.body)["choices"][0]["text"];
  ASSERT_FALSE(want.empty());

  {
    Client c(port_, 60.0);
    ASSERT_TRUE(c.Send(Request(Body(false))));
    ASSERT_TRUE(c.ShutdownWrite());
    auto r = c.ReadFinalResponse();
    ASSERT_TRUE(r) << "no response to a half-closed client";
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["text"], want);
    EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  }
  {
    Client c(port_, 60.0);
    ASSERT_TRUE(c.Send(Request(Body(true))));
    ASSERT_TRUE(c.ShutdownWrite());
    auto r = c.ReadFinalResponse();
    ASSERT_TRUE(r) << "no stream for a half-closed client";
    ASSERT_EQ(r->status, 200) << r->body;
    // The events, less the server's probes (SSE comments).
    std::string text;
    bool done = false;
    size_t pos = 0;
    while (pos < r->body.size()) {
      const size_t end = r->body.find("\n\n", pos);
      ASSERT_NE(end, std::string::npos) << r->body;
      const std::string event = r->body.substr(pos, end - pos);
      pos = end + 2;
      if (event.rfind(":", 0) == 0) continue;
      ASSERT_EQ(event.rfind("data: ", 0), 0u) << event;
      const std::string data = event.substr(6);
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      EXPECT_FALSE(done) << "an event after [DONE]";
      const json j = json::parse(data);
      text += j["choices"][0]["text"].get<std::string>();
    }
    EXPECT_TRUE(done) << r->body;
    EXPECT_EQ(text, want);
  }
  // The deployment still serves.
  EXPECT_EQ(HttpCall(port_, "POST", "/v1/completions", Body(false).dump()).status, 200);
}

}  // namespace
}  // namespace tessera
