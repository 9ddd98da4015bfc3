// The rules of the leader's messages (common/wire/leader_messages.h) as
// ValidateEnvelope applies them: each bad field is refused with its name,
// and GenerationRequest survives the round trip through the wire.
#include "common/wire/leader_messages.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/engine/generation_codec.h"
#include "common/wire/control_codec.h"

namespace tessera {
namespace {

control::Envelope GoodGenerate() {
  control::Envelope e;
  e.set_worker_id("w0");
  e.set_protocol_version(kControlProtocolVersion);
  e.mutable_generate()->set_plan_version(3);
  GenerationRequest r;
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = 4;
  r.stop = {"\n\n"};
  r.sampling.temperature = 0.5f;
  r.sampling.logprobs = 2;
  r.sampling.stop_token_ids = {7};
  GenerationRequestToProto(11, r, e.mutable_generate()->add_requests());
  r.share_prompt_of = 0;
  GenerationRequestToProto(12, r, e.mutable_generate()->add_requests());
  return e;
}

TEST(LeaderMessages, GenerationRequestRoundTrips) {
  control::Envelope e = GoodGenerate();
  auto bytes = EncodeEnvelope(e);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto back = DecodeEnvelope(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const GenerationRequest r = GenerationRequestFromProto(back->generate().requests(1));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 4);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_EQ(r.sampling.stop_token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(r.share_prompt_of, 0);
  EXPECT_EQ(std::string(EnvelopeBodyName(*back)), "generate");
}

TEST(LeaderMessages, BadGenerateFieldsAreNamed) {
  const std::vector<std::pair<std::function<void(control::Generate*)>, std::string>> cases = {
      {[](control::Generate* g) { g->set_plan_version(0); }, "plan_version is 0"},
      {[](control::Generate* g) { g->clear_requests(); }, "0 requests"},
      {[](control::Generate* g) { g->mutable_requests(1)->set_request_id(11); },
       "requests[1]: request_id 11 is <= 0 or repeated"},
      {[](control::Generate* g) { g->mutable_requests(0)->clear_prompt_ids(); },
       "requests[0] (request_id 11): prompt_ids is empty"},
      {[](control::Generate* g) { g->mutable_requests(0)->set_prompt_ids(2, -5); },
       "prompt_ids[2] is -5"},
      {[](control::Generate* g) { g->mutable_requests(0)->set_max_tokens(-1); },
       "max_tokens -1 < 0"},
      {[](control::Generate* g) { g->mutable_requests(0)->mutable_sampling()->set_top_p(2); },
       "sampling"},
      {[](control::Generate* g) { g->mutable_requests(0)->add_stop(""); }, "stop[1] is empty"},
      {[](control::Generate* g) { g->mutable_requests(1)->set_prompt_ids(0, 9); },
       "share_prompt_of 0 is not an earlier request with the same prompt"},
      {[](control::Generate* g) { g->mutable_requests(0)->set_share_prompt_of(0); },
       "share_prompt_of 0"},
  };
  for (const auto& [mutate, want] : cases) {
    control::Envelope e = GoodGenerate();
    mutate(e.mutable_generate());
    const Status s = ValidateEnvelope(e);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << want;
    EXPECT_NE(s.message().find(want), std::string::npos) << s.message() << "\n  want: " << want;
    EXPECT_NE(s.message().find("generate"), std::string::npos) << s.message();
  }
}

TEST(LeaderMessages, BadUpdatesAndCancelsAreNamed) {
  auto update = [] {
    control::Envelope e;
    e.set_worker_id("w0");
    e.set_protocol_version(kControlProtocolVersion);
    e.set_protocol_version(kControlProtocolVersion);
    control::RequestUpdates* r = e.mutable_request_updates();
    r->set_plan_version(3);
    control::RequestUpdate* u = r->add_updates();
    u->set_request_id(11);
    TokenUpdateToProto("hi", 5, nullptr, u->add_tokens());
    return e;
  };
  EXPECT_TRUE(ValidateEnvelope(update()).ok());
  const std::vector<std::pair<std::function<void(control::RequestUpdate*)>, std::string>> cases = {
      {[](control::RequestUpdate* u) { u->set_request_id(0); }, "request_id <= 0"},
      {[](control::RequestUpdate* u) { u->mutable_tokens(0)->set_token_id(-3); }, "< -1"},
      {[](control::RequestUpdate* u) { u->mutable_tokens(0)->set_logprob(-1.0f); },
       "without has_logprobs"},
      {[](control::RequestUpdate* u) { u->set_finish_reason("length"); }, "without finished"},
      {[](control::RequestUpdate* u) {
         u->set_finished(true);
         u->set_finish_reason("done");
       },
       "finish_reason \"done\""},
      {[](control::RequestUpdate* u) {
         u->set_finished(true);
         u->set_finish_reason("error");
       },
       "an error goes with"},
  };
  for (const auto& [mutate, want] : cases) {
    control::Envelope e = update();
    mutate(e.mutable_request_updates()->mutable_updates(0));
    const Status s = ValidateEnvelope(e);
    EXPECT_NE(s.message().find(want), std::string::npos) << s.message() << "\n  want: " << want;
    EXPECT_NE(s.message().find("updates[0]"), std::string::npos) << s.message();
  }
  // The load: no more free blocks than blocks, no more prefix-cache hits
  // than tokens looked up.
  control::Envelope loaded = update();
  control::LeaderLoad* load = loaded.mutable_request_updates()->mutable_load();
  load->set_kv_blocks(8);
  load->set_free_kv_blocks(8);
  load->set_prefix_cache_query_tokens(40);
  load->set_prefix_cache_hit_tokens(40);
  load->set_preemptions(3);
  EXPECT_TRUE(ValidateEnvelope(loaded).ok()) << ValidateEnvelope(loaded).message();
  load->set_free_kv_blocks(9);
  EXPECT_NE(ValidateEnvelope(loaded).message().find("load: free_kv_blocks 9 > kv_blocks 8"),
            std::string::npos)
      << ValidateEnvelope(loaded).message();
  load->set_free_kv_blocks(1);
  load->set_prefix_cache_hit_tokens(41);
  EXPECT_NE(ValidateEnvelope(loaded).message().find("load: prefix_cache_hit_tokens 41 > "
                                                    "prefix_cache_query_tokens 40"),
            std::string::npos)
      << ValidateEnvelope(loaded).message();

  control::Envelope c;
  c.set_worker_id("w0");
  c.set_protocol_version(kControlProtocolVersion);
  c.mutable_cancel_requests()->set_plan_version(3);
  EXPECT_NE(ValidateEnvelope(c).message().find("request_ids is empty"), std::string::npos);
  c.mutable_cancel_requests()->add_request_ids(-2);
  EXPECT_NE(ValidateEnvelope(c).message().find("request_ids[0] is -2"), std::string::npos);
}

TEST(LeaderMessages, SchedulerOptionsRoundTripThroughAssignShardLeader) {
  SchedulerOptions o;
  o.max_batch_tokens = 300;
  o.max_sequences = 7;
  o.queue_limit = 9;
  o.max_context = 333;
  o.prefill_chunk_tokens = 64;
  o.prefix_caching = false;
  o.model_id = "m";
  o.prefill_chunk_budget = PrefillChunkBudget::kCost;
  const SchedulerOptions back = LeaderOptionsFromProto(LeaderOptionsToProto(o), 5);
  EXPECT_EQ(back.max_batch_tokens, 300);
  EXPECT_EQ(back.max_sequences, 7);
  EXPECT_EQ(back.queue_limit, 9);
  EXPECT_EQ(back.max_context, 333);
  EXPECT_EQ(back.prefill_chunk_tokens, 64);
  EXPECT_FALSE(back.prefix_caching);
  EXPECT_EQ(back.model_id, "m");
  EXPECT_EQ(back.plan_version, 5u);
  EXPECT_EQ(back.prefill_chunk_budget, PrefillChunkBudget::kCost);
  o.prefill_chunk_budget = PrefillChunkBudget::kTokens;
  EXPECT_EQ(LeaderOptionsFromProto(LeaderOptionsToProto(o), 5).prefill_chunk_budget,
            PrefillChunkBudget::kTokens);
  // Fields left at 0 keep the defaults; an older coordinator's (no prefill_chunk_by_cost)
  // fixed chunks stay fixed.
  const SchedulerOptions old = LeaderOptionsFromProto(control::LeaderOptions{}, 1);
  EXPECT_EQ(old.max_batch_tokens, SchedulerOptions{}.max_batch_tokens);
  EXPECT_EQ(old.prefill_chunk_budget, PrefillChunkBudget::kTokens);
}

TEST(LeaderMessages, FinishReasonNamesRoundTrip) {
  for (FinishReason r : {FinishReason::kLength, FinishReason::kEos, FinishReason::kStop,
                         FinishReason::kCancelled, FinishReason::kError})
    EXPECT_EQ(FinishReasonFromName(FinishReasonName(r)), r);
  EXPECT_FALSE(FinishReasonFromName("done").has_value());
}

}  // namespace
}  // namespace tessera
