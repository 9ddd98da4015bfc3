#!/usr/bin/env python3
"""Records how transformers renders the fixture chat templates.

Reads tests/fixtures/chat_templates/*.jinja, renders each conversation below with
transformers' own render_jinja_template (the function apply_chat_template uses) and
writes tests/fixtures/chat_templates/expected.json: per case the template, the
context and the expected text, or the error message for a conversation the template
refuses. tests/unit/common/tokenizer/jinja_fixture_test.cc renders the same with
Tessera's interpreter and compares exactly.

Run: $HOME/.cache/tessera/venv/bin/python tools/record_chat_templates.py
"""
import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "chat_templates"

SYS = {"role": "system", "content": "You are terse.\nAnswer in one line."}
U1 = {"role": "user", "content": "  What is 2+2? \"quoted\" & <tags> été 😀  "}
A1 = {"role": "assistant", "content": "4."}
U2 = {"role": "user", "content": "And 3+3?"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]
TOKENS = {
    "smollm2": ("", "<|im_end|>"),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2_5": ("", "<|im_end|>"),
    "qwen3": ("", "<|im_end|>"),
    "gemma2": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "mistral_v0_3": ("<s>", "</s>"),
    "mistral_small": ("<s>", "</s>"),
}
COMMON = [
    ("system", [SYS, U1], True, None, {}),
    ("multi_turn", [U1, A1, U2], True, None, {}),
    ("no_generation_prompt", [U1, A1], False, None, {}),
]
EXTRA = {
    "llama3_1": [("tools", [SYS, U1], True, TOOLS, {}),
                 ("date", [U1], True, None, {"date_string": "02 Dec 2026"})],
    "qwen2_5": [("tools", [SYS, U1], True, TOOLS, {})],
    "qwen3": [("think_in_content", [U1, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4."},
                                    U2, {"role": "assistant", "content": "<think>\nadd again\n</think>\n\n6."}],
               False, None, {}),
              ("reasoning_content", [U1, {"role": "assistant", "content": "4.",
                                          "reasoning_content": "2 and 2"}], False, None, {}),
              ("thinking_off", [U1], True, None, {"enable_thinking": False}),
              ("tools", [SYS, U1], True, TOOLS, {})],
    "gemma2": [("raises_on_system", [SYS, U1], True, None, {})],
    "gemma3": [("raises_on_alternation", [U1, U2], True, None, {})],
    "mistral_v0_3": [("raises_on_alternation", [U1, U2], True, None, {})],
}
# Templates reading today's date: pass one, or give a system message.
FIXED = {"llama3_2": {"date_string": "02 Dec 2026"}}
SKIP = {("gemma2", "system"), ("mistral_small", "multi_turn"), ("mistral_small", "no_generation_prompt")}


def main():
    cases = []
    for path in sorted(ROOT.glob("*.jinja")):
        name = path.stem
        template = path.read_text()
        bos, eos = TOKENS[name]
        for case, messages, gen, tools, extra in COMMON + EXTRA.get(name, []):
            if (name, case) in SKIP:
                continue
            extra = {**FIXED.get(name, {}), **extra}
            entry = {"template": name, "case": case, "messages": messages,
                     "add_generation_prompt": gen, "tools": tools, "bos_token": bos,
                     "eos_token": eos, "extra": extra}
            try:
                rendered, _ = render_jinja_template(
                    conversations=[messages], tools=tools, chat_template=template,
                    add_generation_prompt=gen, bos_token=bos, eos_token=eos, **extra)
                entry["expected"] = rendered[0]
            except Exception as e:  # the template's raise_exception
                entry["error"] = str(e)
            cases.append(entry)
    out = ROOT / "expected.json"
    out.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
