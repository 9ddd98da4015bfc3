"""Tool calling through the official `openai` client against running daemons.

Usage: python tests/support/openai_tools_check.py PORT MODEL
The model's chat template renders tools in Qwen's <tool_call> format
(tests/integration/tool_calls_daemon_test.cc serves one). With a random fixture model
only enforced calls have a known structure, so the checks are:
  - tool_choice "required" and a named function: the call parses, names an
    allowed function, and its arguments are valid against its schema;
  - a round trip: the call, a tool message with its result, a final answer;
  - streamed tool-call deltas join into the same call as the whole response;
  - bad input (a parameters schema that is none, an unknown function named by
    tool_choice, wrong types) is a 400 naming the field, and the server keeps
    serving.
Exits non-zero (with the reason) when any check fails.
"""
import json
import sys

import openai

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city for a few days",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"},
            },
            "required": ["city", "days", "metric"],
            "additionalProperties": False,
        },
    },
}
NOOP = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {},
                                                                        "additionalProperties": False}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_weather_args(arguments):
    args = json.loads(arguments)
    assert set(args) == {"city", "days", "metric"}, args
    assert args["city"] in ("Paris", "Oslo", "Lima"), args
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7, args
    assert isinstance(args["metric"], bool), args
    return args


def required_call(client, model, **extra):
    out = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER, NOOP],
                                         tool_choice="required", parallel_tool_calls=False,
                                         max_tokens=120, **extra)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None, choice.message
        calls = choice.message.tool_calls
        assert len(calls) == 1, calls
        call = calls[0]
        assert call.type == "function" and call.id.startswith("call_"), call
        if call.function.name == "get_weather":
            check_weather_args(call.function.arguments)
        else:
            assert call.function.name == "noop" and json.loads(call.function.arguments) == {}, call
    return out


def round_trip(client, model):
    first = required_call(client, model, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    named = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER, NOOP], max_tokens=120, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    named_call = named.choices[0].message.tool_calls[0]
    assert named_call.function.name == "get_weather", named_call
    check_weather_args(named_call.function.arguments)
    history = QUESTION + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear", "celsius": 21})},
    ]
    final = client.chat.completions.create(model=model, messages=history, tools=[WEATHER, NOOP],
                                           tool_choice="none", max_tokens=6, temperature=0)
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length"), choice
    assert isinstance(choice.message.content, str) and choice.message.tool_calls is None, choice
    # The tool's result was part of the prompt.
    assert final.usage.prompt_tokens > first.usage.prompt_tokens, (final.usage, first.usage)
    return first


def streamed_deltas_join(client, model, whole):
    calls, finish = {}, None
    for chunk in client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER, NOOP],
                                                tool_choice="required", parallel_tool_calls=False,
                                                max_tokens=120, temperature=0, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content, delta
        for d in delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.id.startswith("call_") and d.type == "function" and d.function.name, d
                calls[d.index] = {"name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and d.function.name is None, d
                calls[d.index]["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls", finish
    want = whole.choices[0].message.tool_calls[0]
    assert list(calls) == [0], calls
    assert calls[0] == {"name": want.function.name, "arguments": want.function.arguments}, (calls, want)


def bad_input(client, model):
    bad_schema = json.loads(json.dumps(WEATHER))
    bad_schema["function"]["parameters"] = {"type": "object", "properties": {"city": {"type": "place"}}}
    cases = [
        ({"tools": [bad_schema]}, "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": {"get_weather": WEATHER}}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    for fields, param in cases:
        try:
            client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, **fields)
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == param, (fields, e.body)
        else:
            raise AssertionError(f"accepted {fields}")
    ok = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length"), ok


def main() -> int:
    port, model = int(sys.argv[1]), sys.argv[2]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    whole = round_trip(client, model)
    required_call(client, model, temperature=1.0, seed=3, n=3)
    streamed_deltas_join(client, model, whole)
    bad_input(client, model)
    print("tool call checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
