"""Drives a running Tessera coordinator with the official `openai` client.

Usage: python tests/support/openai_client_check.py PORT MODEL
Exits non-zero (with the reason) when any check fails. Run by
tests/integration/daemon_test.cc against real daemons.
"""
import sys

import openai


def main() -> int:
    port, model = int(sys.argv[1]), sys.argv[2]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    models = [m.id for m in client.models.list().data]
    assert models == [model], models

    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0)
    assert chat.choices[0].finish_reason in ("length", "stop"), chat
    assert chat.usage.completion_tokens >= 1, chat.usage
    text = chat.choices[0].message.content

    pieces = []
    for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0,
            stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == text, ("stream != non-stream", pieces, text)

    done = client.completions.create(model=model, prompt=[5, 17, 42], max_tokens=4, temperature=0)
    assert done.choices[0].finish_reason == "length", done

    # Log-probabilities, chat shape: one entry per generated token, <= 0,
    # alternatives best first, the greedy token first among them.
    lp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens, (content, lp.usage)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2, t
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob, t
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob, t
        assert t.bytes == list(t.token.encode()), t
    # Legacy completions shape.
    legacy = client.completions.create(model=model, prompt=[5, 17, 42], max_tokens=4,
                                       temperature=0, logprobs=2)
    lpc = legacy.choices[0].logprobs
    assert len(lpc.tokens) == len(lpc.token_logprobs) == len(lpc.top_logprobs) == 4, lpc
    assert all(v <= 0 for v in lpc.token_logprobs), lpc
    assert lpc.text_offset[0] == 0, lpc

    try:
        client.completions.create(model=model, prompt="x", temperature=5)
        raise AssertionError("temperature=5 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "temperature" in str(e), e
    print("openai client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
