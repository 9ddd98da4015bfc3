#!/usr/bin/env python3
"""Records transformers' prompt log-probabilities for a fixture model (echo + logprobs).

For each prompt (token ids), one float32 forward pass on CPU over the whole prompt; at
every position i >= 1 the log-probability of prompt token i given tokens 0..i-1
(log_softmax of the logits at position i-1) and the TOP most likely tokens there.
tests/integration/echo_logprobs_test.cc checks Tessera's /v1/completions with
echo: true, max_tokens: 0, logprobs: TOP against this file; CI does not install torch.

Writes DIR/echo_reference.json:
  {"generator", "transformers_version", "torch_version", "top", "tolerance_note",
   "prompts": [{"ids": [...], "token_logprobs": [null, ...],
                "top": [null, [[id, logprob], ...], ...], "min_top_gap": float}]}

Usage: python3 tools/make_echo_reference.py --model tests/fixtures/models/llama_gqa_f32
(needs tools/requirements-fixtures.txt, e.g. in a separate venv).
"""

import argparse
import json
import os

PROMPTS = [
    [1, 5, 17, 42, 7, 99, 300, 12],
    [1, 250, 251, 252, 3, 3, 3, 480, 17, 64, 128, 256, 511, 2, 9],
    [7, 7],
]
TOP = 3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="fixture model folder")
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for ids in PROMPTS:
            logits = model(torch.tensor([ids])).logits[0].double()
            logprobs = torch.log_softmax(logits, dim=-1)
            token_logprobs, top, gaps = [None], [None], []
            for i in range(1, len(ids)):
                row = logprobs[i - 1]
                token_logprobs.append(float(row[ids[i]]))
                values, order = torch.sort(row, descending=True, stable=True)
                top.append([[int(order[k]), float(values[k])] for k in range(TOP)])
                gaps.extend(float(values[k] - values[k + 1]) for k in range(TOP))
            out.append({"ids": ids, "token_logprobs": token_logprobs, "top": top,
                        "min_top_gap": min(gaps)})
    doc = {
        "generator": "tools/make_echo_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "top": TOP,
        "tolerance_note": "float32 forward on CPU, log_softmax in float64; compare "
                          "token_logprobs and top logprobs at 1e-4 and the top ids where the "
                          "gap to the next exceeds 1e-4",
        "prompts": out,
    }
    path = os.path.join(args.model, "echo_reference.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(out)} prompts, min top gap "
          f"{min(p['min_top_gap'] for p in out):.2e}")


if __name__ == "__main__":
    main()
