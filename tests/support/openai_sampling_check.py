"""Logits processing through the official `openai` client against running daemons.

Usage: python tests/support/openai_sampling_check.py PORT MODEL CASES_JSON
CASES_JSON (written by tests/integration/sampling_daemon_test.cc): a list of
{"name", "prompt": [ids], "max_tokens", "fields": {...}, "text", "finish_reason",
"completion_tokens"}; "text" is what a reference computed on the model's logits
expects. OpenAI's own fields go as keyword arguments, vLLM's extensions
(repetition_penalty, min_p, min_tokens, stop_token_ids) through extra_body, as a
client of vLLM sends them. Then each new field with a wrong type, out of range or
contradictory must be a 400 naming it, and the server must still answer.
Exits non-zero (with the reason) when any check fails.
"""
import json
import sys

import openai

OPENAI_FIELDS = ("presence_penalty", "frequency_penalty", "logit_bias", "temperature", "seed")


def run_case(client, model, case):
    kwargs = {k: v for k, v in case["fields"].items() if k in OPENAI_FIELDS}
    extra = {k: v for k, v in case["fields"].items() if k not in OPENAI_FIELDS}
    kwargs.setdefault("temperature", 0)
    out = client.completions.create(model=model, prompt=case["prompt"], max_tokens=case["max_tokens"],
                                    extra_body=extra, **kwargs)
    choice = out.choices[0]
    got = (choice.text, choice.finish_reason, out.usage.completion_tokens)
    want = (case["text"], case["finish_reason"], case["completion_tokens"])
    assert got == want, (case["name"], "got", got, "want", want)


BAD = [
    ({"presence_penalty": "high"}, "presence_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 500}}, "logit_bias"),
    ({"logit_bias": {"100000": 1}}, "logit_bias"),  # outside the model's vocab
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"min_p": -0.1}}, "min_p"),
    ({"extra_body": {"min_tokens": 9}}, "min_tokens"),  # above max_tokens 4
    ({"extra_body": {"min_tokens": "3"}}, "min_tokens"),
    ({"extra_body": {"stop_token_ids": [1, -2]}}, "stop_token_ids"),
    ({"extra_body": {"stop_token_ids": [100000]}}, "stop_token_ids"),
    ({"echo": "yes"}, "echo"),
    ({"extra_body": {"prompt_logprobs": 21}}, "prompt_logprobs"),
    ({"n": 50}, "n"),  # n x prompts over scheduler.queue_limit (40 in the test config)
    ({"n": 2, "best_of": 41}, "best_of"),
    ({"n": 3, "best_of": 2}, "best_of"),
]


def check_echo(client, model):
    """echo with logprobs (lm-eval's log-likelihood request), and echo before a completion."""
    prompt = [5, 17, 42, 7, 99]
    e = client.completions.create(model=model, prompt=prompt, echo=True, max_tokens=0, logprobs=2)
    choice = e.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt) and lp.token_logprobs[0] is None, lp
    assert lp.top_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:]), lp
    assert choice.text == "".join(lp.tokens), (choice.text, lp.tokens)
    assert e.usage.completion_tokens == 0 and choice.finish_reason == "length", e
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0)
    both = client.completions.create(model=model, prompt=prompt, echo=True, max_tokens=3,
                                     temperature=0, logprobs=1)
    assert both.choices[0].text == choice.text + plain.choices[0].text, (both, plain)
    blp = both.choices[0].logprobs
    assert len(blp.tokens) == len(prompt) + 3, blp
    for a, b in zip(blp.token_logprobs[1:len(prompt)], lp.token_logprobs[1:]):
        assert abs(a - b) < 1e-5, (a, b)
    # Streamed: the prompt's chunk first, then the completion's; the same text and entries.
    text, tokens, values = "", [], []
    for chunk in client.completions.create(model=model, prompt=prompt, echo=True, max_tokens=3,
                                           temperature=0, logprobs=1, stream=True):
        for ch in chunk.choices:
            text += ch.text
            if ch.logprobs:
                tokens += ch.logprobs.tokens
                values += ch.logprobs.token_logprobs
    assert text == both.choices[0].text, (text, both.choices[0].text)
    assert tokens == blp.tokens and values[0] is None, (tokens, blp.tokens, values)
    offsets = blp.text_offset
    # text_offset counts bytes (docs/operations.md).
    assert offsets == sorted(offsets) and offsets[len(prompt)] == len(choice.text.encode()), offsets


def check_choices(client, model):
    """n=3 at temperature 1 with a seed: 3 choices, reproducibly, streamed by index; best_of."""
    kw = dict(model=model, prompt=[5, 17, 42], max_tokens=8, temperature=1.0, seed=11, n=3)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2], a
    texts = [c.text for c in a.choices]
    assert texts == [c.text for c in b.choices], (texts, b)
    assert len(set(texts)) > 1, ("the choices sample with seed + index", texts)
    assert a.usage.completion_tokens == 24, a.usage
    assert a.usage.prompt_tokens == 3, ("the prompt counts once, not per choice", a.usage)
    streamed = ["", "", ""]
    for chunk in client.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            streamed[ch.index] += ch.text
    assert streamed == texts, (streamed, texts)
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                          n=2, max_tokens=4, temperature=1.0, seed=5)
    assert [c.index for c in chat.choices] == [0, 1], chat
    # best_of 4, n 2: the two of the four (those of n=4 with the same seed) with the highest
    # cumulative log-probability, best first.
    common = dict(model=model, prompt=[9, 8, 7], max_tokens=6, temperature=1.0, seed=3, logprobs=0)
    four = client.completions.create(n=4, **common)
    best = client.completions.create(n=2, best_of=4, **common)
    assert best.usage.prompt_tokens == four.usage.prompt_tokens, (best.usage, four.usage)
    sums = sorted((sum(c.logprobs.token_logprobs) for c in four.choices), reverse=True)
    got = [sum(c.logprobs.token_logprobs) for c in best.choices]
    assert len(got) == 2 and all(abs(x - y) < 1e-4 for x, y in zip(got, sums[:2])), (got, sums)


def check_bad_input(client, model):
    for kwargs, field in BAD:
        try:
            client.completions.create(model=model, prompt=[5, 6], max_tokens=4, **kwargs)
        except openai.BadRequestError as e:
            assert e.status_code == 400, (field, e)
            body = e.body if isinstance(e.body, dict) else {}
            param = body.get("param") if "param" in body else body.get("error", {}).get("param")
            assert param == field, (field, "param", param, str(e))
            assert field in str(e), (field, str(e))
            continue
        raise AssertionError(f"{kwargs} was accepted")
    # Still serving.
    ok = client.completions.create(model=model, prompt=[5, 6], max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2, ok


def main() -> int:
    port, model, cases_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    with open(cases_path) as f:
        cases = json.load(f)
    for case in cases:
        run_case(client, model, case)
    check_echo(client, model)
    check_choices(client, model)
    check_bad_input(client, model)
    print(f"sampling checks passed ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
