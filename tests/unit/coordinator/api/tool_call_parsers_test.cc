// The tool-call parsers of each family (coordinator/api/tool_parser_*.cc),
// whole and streamed: a stream fed the output a few bytes at a time sends
// content and tool-call deltas that join into exactly the whole output's
// content and calls, the first delta of each call carrying its id and name.
// The format each fixture chat template selects.
#include "coordinator/api/tool_call_parsers.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "coordinator/api/tool_call_stream.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;

struct Expected {
  std::string content;
  std::vector<std::pair<std::string, json>> calls;  // name, arguments
};

void ExpectWhole(ToolCallFormat f, const std::string& text, const Expected& want) {
  SCOPED_TRACE(text);
  const ToolCallOutput out = ParseToolCallOutput(f, text);
  EXPECT_EQ(out.content, want.content);
  ASSERT_EQ(out.calls.size(), want.calls.size());
  for (size_t k = 0; k < out.calls.size(); ++k) {
    EXPECT_EQ(out.calls[k].name, want.calls[k].first);
    EXPECT_EQ(json::parse(out.calls[k].arguments), want.calls[k].second);
    if (f == ToolCallFormat::kMistral) {
      EXPECT_EQ(out.calls[k].id.size(), 9u) << out.calls[k].id;
    } else {
      EXPECT_EQ(out.calls[k].id.rfind("call_", 0), 0u) << out.calls[k].id;
    }
  }
}

// Streams `text` in pieces of `step` bytes; the deltas join into the whole
// parse's content and calls.
void ExpectStreamJoins(ToolCallFormat f, const std::string& text, size_t step) {
  SCOPED_TRACE(text + " in pieces of " + std::to_string(step));
  ToolCallStream stream(f);
  std::string content;
  std::vector<ToolCallDelta> firsts;
  std::vector<std::string> args;
  auto take = [&](const ToolCallStream::Update& u) {
    content += u.content;
    for (const ToolCallDelta& d : u.calls) {
      if (static_cast<size_t>(d.index) == firsts.size()) {
        ASSERT_TRUE(d.id && d.name) << "the first delta of call " << d.index;
        firsts.push_back(d);
        args.push_back(d.arguments);
      } else {
        ASSERT_LT(static_cast<size_t>(d.index), firsts.size());
        EXPECT_FALSE(d.id || d.name) << "a later delta of call " << d.index;
        args[static_cast<size_t>(d.index)] += d.arguments;
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += step) take(stream.Push(text.substr(i, step)));
  take(stream.Finish());
  const ToolCallOutput whole = ParseToolCallOutput(f, text);
  EXPECT_EQ(content, whole.content);
  ASSERT_EQ(firsts.size(), whole.calls.size());
  EXPECT_EQ(stream.called(), !whole.calls.empty());
  for (size_t k = 0; k < firsts.size(); ++k) {
    EXPECT_EQ(*firsts[k].name, whole.calls[k].name);
    EXPECT_EQ(args[k], whole.calls[k].arguments);
  }
}

void Check(ToolCallFormat f, const std::string& text, const Expected& want) {
  ExpectWhole(f, text, want);
  for (size_t step : {1, 3, 7, 1000}) ExpectStreamJoins(f, text, step);
}

TEST(ToolCallParsers, HermesBlocks) {
  const auto f = ToolCallFormat::kHermes;
  Check(f,
        "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\", \"days\": [1, 2]}}\n</tool_call>",
        {"Let me look.", {{"get_weather", {{"city", "Paris"}, {"days", {1, 2}}}}}});
  Check(f,
        "<tool_call>\n{\"name\":\"a\",\"arguments\":{\"s\":\"}{\\\"\"}}\n</tool_call>\n"
        "<tool_call>\n{\"arguments\":{},\"name\":\"b\"}\n</tool_call>",
        {"", {{"a", {{"s", "}{\""}}}, {"b", json::object()}}});
  Check(f, "<tool_call>\n{\"name\": \"noargs\"}\n</tool_call>", {"", {{"noargs", json::object()}}});
  // No call: all content, a lone "<" and trailing space included.
  Check(f, "just text <", {"just text <", {}});
  // A malformed or cut-off call: all content.
  Check(f, "<tool_call>\n{\"name\": 5}\n</tool_call>",
        {"<tool_call>\n{\"name\": 5}\n</tool_call>", {}});
  // Cut off (max_tokens): no call in the whole output; a stream has sent the
  // call's start by then and ends as it went (finish_reason "length").
  ExpectWhole(f, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": ",
              {"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": ", {}});
}

TEST(ToolCallParsers, Llama3Json) {
  const auto f = ToolCallFormat::kLlama3Json;
  Check(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        {"", {{"get_weather", {{"city", "Oslo"}}}}});
  Check(f,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", "
        "\"parameters\": {\"n\": -2.5e3}}",
        {"", {{"a", {{"n", 1}}}, {"b", {{"n", -2.5e3}}}}});
  Check(f, "The weather is fine.", {"The weather is fine.", {}});
  Check(f, "{not a call}", {"{not a call}", {}});
}

TEST(ToolCallParsers, Mistral) {
  const auto f = ToolCallFormat::kMistral;
  Check(f,
        "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"b\", "
        "\"arguments\": {}}]",
        {"", {{"a", {{"q", "x"}}}, {"b", json::object()}}});
  // The marker is a special token that decoding drops.
  Check(f, " [{\"name\": \"a\", \"arguments\": {\"q\": true}}]", {"", {{"a", {{"q", true}}}}});
  Check(f, "Sure. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}]",
        {"Sure.", {{"a", json::object()}}});
  Check(f, "[1, 2] is a list", {"[1, 2] is a list", {}});
}

TEST(ToolCallParsers, TheTemplateChoosesTheFormat) {
  const auto format = [](const std::string& name) {
    return DetectToolCallFormat(
        testing::ReadFileOrDie(testing::FixturePath("chat_templates/" + name + ".jinja")));
  };
  EXPECT_EQ(format("qwen2_5"), ToolCallFormat::kHermes);
  EXPECT_EQ(format("qwen3"), ToolCallFormat::kHermes);
  EXPECT_EQ(format("llama3_1"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(format("llama3_2"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(format("mistral_v0_3"), ToolCallFormat::kMistral);
  EXPECT_EQ(format("smollm2"), std::nullopt);
  EXPECT_EQ(format("gemma2"), std::nullopt);
}

// Mutated and cut outputs of every family (seeded): the parsers never fail
// on any text, and a stream joins into the whole parse whenever the whole
// output holds calls or the stream never started one.
TEST(ToolCallParsers, MutatedOutputsStreamAsTheyParseWhole) {
  const std::vector<std::pair<ToolCallFormat, std::string>> samples = {
      {ToolCallFormat::kHermes,
       "ok\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::kLlama3Json,
       "{\"name\": \"a\", \"parameters\": {\"x\": \"\\\"\"}}; {\"name\": \"b\", \"parameters\": "
       "{}}"},
      {ToolCallFormat::kMistral,
       "hi [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": null}}, {\"name\": \"b\", "
       "\"arguments\": {}}]"}};
  const std::string noise = "{}[]\",:<>/\\ \nab_TOOL";
  std::mt19937 rng(37);
  for (const auto& [format, sample] : samples) {
    for (int round = 0; round < 300; ++round) {
      std::string text = sample;
      const int edits = static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !text.empty(); ++e) {
        const size_t at = rng() % text.size();
        if (rng() % 2) {
          text[at] = noise[rng() % noise.size()];
        } else {
          text.erase(at, 1);
        }
      }
      if (rng() % 3 == 0) text.resize(rng() % (text.size() + 1));  // cut off
      SCOPED_TRACE(text);
      ToolCallStream stream(format);
      std::string content;
      std::vector<std::string> names, args;
      auto take = [&](const ToolCallStream::Update& u) {
        content += u.content;
        for (const ToolCallDelta& d : u.calls) {
          if (d.name) {
            names.push_back(*d.name);
            args.push_back(d.arguments);
          } else {
            ASSERT_LT(static_cast<size_t>(d.index), args.size());
            args[static_cast<size_t>(d.index)] += d.arguments;
          }
        }
      };
      const size_t step = 1 + rng() % 5;
      for (size_t i = 0; i < text.size(); i += step) take(stream.Push(text.substr(i, step)));
      take(stream.Finish());
      const ToolCallOutput whole = ParseToolCallOutput(format, text);
      if (!whole.calls.empty() || !stream.called()) {
        EXPECT_EQ(content, whole.content);
        ASSERT_EQ(names.size(), whole.calls.size());
        for (size_t k = 0; k < names.size(); ++k) {
          EXPECT_EQ(names[k], whole.calls[k].name);
          EXPECT_EQ(args[k], whole.calls[k].arguments);
        }
      }
    }
  }
}

TEST(ToolCallScan, ValuesAndMarkers) {
  EXPECT_EQ(ScanJsonValue("{\"a\": [1, \"]\"]} x", 0).state, ScanState::kComplete);
  EXPECT_EQ(ScanJsonValue("{\"a\": [1, \"]\"]} x", 0).end, 15u);
  EXPECT_EQ(ScanJsonValue("{\"a\": [1", 0).state, ScanState::kPartial);
  EXPECT_EQ(ScanJsonValue("{\"a\": [1}", 0).state, ScanState::kMalformed);
  EXPECT_EQ(ScanJsonValue("12", 0).state, ScanState::kPartial);
  EXPECT_EQ(ScanJsonValue("12,", 0).state, ScanState::kComplete);
  EXPECT_EQ(MarkerPrefixSuffix("abc<tool_", "<tool_call>"), 6u);
  EXPECT_EQ(MarkerPrefixSuffix("abc", "<tool_call>"), 0u);
}

}  // namespace
}  // namespace tessera
