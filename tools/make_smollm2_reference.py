#!/usr/bin/env python3
"""Records Hugging Face transformers' greedy output for the imported SmolLM2 model.

Loads the folder written by tools/import_gguf.py (the dequantized float32 weights)
with transformers on CPU in float32, formats four chat prompts with the model's
chat template (add_generation_prompt=True), and writes, per prompt:
  text            the formatted prompt
  ids             its token ids (tokenizer.json via `tokenizers`, checked against AutoTokenizer)
  last_logits_top10  [[id, logit], ...] at the last prompt position, best first
  greedy          N greedy ids (generate, do_sample=False, use_cache=True); EOS does not stop
                  generation, so this is the plain argmax continuation with unmodified logits
  greedy_margins  top1 - top2 logit at each greedy step
  eos_index       index in `greedy` of the first <|im_end|> (null when none)
  answer          `greedy` up to eos_index, decoded (skip_special_tokens)
It checks that the KV-cache path agrees with a single full forward pass, that
<|im_start|>/<|im_end|> are single special tokens, and that the answers are coherent
(the France answer must contain "Paris"; the 135M model's other answers are printed
for a human to judge).

With --check-gguf FILE it first loads FILE with transformers' own GGUF loader (needs
`accelerate`) and requires every tensor of DIR/model.safetensors to be bit-identical to it
(this independently checks the dequantization and the Q/K un-permutation), and the
tokenizer to give the same ids on a few strings.

Usage:
  python3 tools/make_smollm2_reference.py --model DIR [--out tests/fixtures/smollm2_reference.json]
                                          [--check-gguf CACHE/gguf/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

import argparse
import json
import os
import sys

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "How many legs does a spider have?",
]


def check_against_transformers_gguf(model_dir, gguf_path, raw_tok):
    """Returns an error string, or None when DIR matches transformers' GGUF import of gguf_path."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    ref = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    ref_sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    ours = load_file(os.path.join(model_dir, "model.safetensors"))
    for k, v in ours.items():
        if k not in ref_sd:
            return "tensor %s is not in transformers' import of %s" % (k, gguf_path)
        if ref_sd[k].shape != v.shape or not np.array_equal(ref_sd[k], v):
            return ("tensor %s differs from transformers' import of %s (max |diff| %g)"
                    % (k, gguf_path, float(np.abs(ref_sd[k] - v).max()) if ref_sd[k].shape == v.shape else -1))
    extra = sorted(set(ref_sd) - set(ours) - {"lm_head.weight"})
    if extra:
        return "tensors missing from %s: %s" % (model_dir, extra)
    ref_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    for text in ("Hello world 12345!", "<|im_start|>user\nWhat is 3.14*2?<|im_end|>\n",
                 "  spaces\t\ttabs  caf\u00e9 \u2603 \u65e5\u672c\u8a9e "):
        if ref_tok(text)["input_ids"] != raw_tok.encode(text).ids:
            return "tokenizer.json and transformers' GGUF tokenizer disagree on %r" % text
    print("check-gguf: all %d tensors bit-identical to transformers' GGUF import; tokenizer agrees" % len(ours))
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="folder written by tools/import_gguf.py")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                  "fixtures", "smollm2_reference.json"))
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--check-gguf", metavar="FILE", help="compare DIR with transformers' GGUF loader on FILE")
    args = ap.parse_args(argv)

    try:
        import torch
        import transformers
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as e:
        print("make_smollm2_reference: error: %s. Install with: pip install -r tools/requirements-fixtures.txt"
              % e, file=sys.stderr)
        return 1

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model_dir = args.model
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(model_dir, f)):
            print("make_smollm2_reference: error: %s is missing %s (run tools/import_gguf.py first)"
                  % (model_dir, f), file=sys.stderr)
            return 1

    raw_tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    if args.check_gguf:
        err = check_against_transformers_gguf(model_dir, args.check_gguf, raw_tok)
        if err:
            print("make_smollm2_reference: error: %s" % err, file=sys.stderr)
            return 1
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        ids = raw_tok.encode("a" + special + "b").ids
        sid = raw_tok.token_to_id(special)
        assert sid is not None and ids.count(sid) == 1 and len(ids) == 3, (special, ids)
        assert hf_tok("a" + special + "b")["input_ids"] == ids, special
    markup = "<|im_start|>user\nHi<|im_end|>\n"
    print("tokens of %r: %s" % (markup, raw_tok.encode(markup).tokens))

    model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                       output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]:
        print("make_smollm2_reference: error: loading %s: %s" % (model_dir, info), file=sys.stderr)
        return 1
    model.eval()
    eos_id = model.config.eos_token_id
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=args.new_tokens, min_new_tokens=0,
                               eos_token_id=None, pad_token_id=eos_id, bos_token_id=model.config.bos_token_id,
                               use_cache=True, return_dict_in_generate=True, output_logits=True)
    # generate() fills unset fields from the model's generation_config.json; clear its EOS there too
    # so that <|im_end|> does not stop generation.
    model.generation_config.eos_token_id = None

    records = []
    for q in PROMPTS:
        text = hf_tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True)
        ids = raw_tok.encode(text).ids
        assert hf_tok(text)["input_ids"] == ids, "tokenizers and AutoTokenizer disagree on %r" % text
        input_ids = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=gen_cfg)
        greedy = out.sequences[0, len(ids):].tolist()
        assert len(greedy) == args.new_tokens, len(greedy)
        margins = []
        for step, logits in enumerate(out.logits):
            top = torch.topk(logits[0].float(), 2)
            assert int(top.indices[0]) == greedy[step], "greedy id is not the argmax at step %d" % step
            margins.append(float(top.values[0] - top.values[1]))
        # One full forward over prompt + greedy[:-1] must pick the same tokens (KV-cache consistency).
        with torch.no_grad():
            full = model(out.sequences[:, :-1]).logits[0]
        cached = torch.stack([l[0] for l in out.logits])
        full_tail = full[len(ids) - 1:]
        assert full_tail.argmax(-1).tolist() == greedy, "cached and uncached greedy differ"
        cache_diff = float((full_tail - cached).abs().max())
        last = full[len(ids) - 1]
        top10 = torch.topk(last, 10)
        eos_index = greedy.index(eos_id) if eos_id in greedy else None
        answer = hf_tok.decode(greedy[:eos_index] if eos_index is not None else greedy,
                               skip_special_tokens=True)
        records.append({
            "question": q,
            "text": text,
            "ids": ids,
            "last_logits_top10": [[int(i), float(v)] for v, i in zip(top10.values, top10.indices)],
            "greedy": greedy,
            "greedy_margins": margins,
            "eos_index": eos_index,
            "answer": answer,
        })
        print("Q: %s\nA: %r\n   prompt %d tokens, eos_index %s, min margin %.4f, cached-vs-full max |dlogit| %.2e"
              % (q, answer, len(ids), eos_index, min(margins), cache_diff))

    checks = {0: ["Paris"]}
    for i, words in checks.items():
        if not any(w in records[i]["answer"] for w in words):
            print("make_smollm2_reference: error: answer to %r is %r, expected one of %s; the weights or the "
                  "tokenizer are wrong" % (PROMPTS[i], records[i]["answer"], words), file=sys.stderr)
            return 1

    source = None
    complete = os.path.join(model_dir, ".complete")
    if os.path.isfile(complete):
        source = json.load(open(complete))
    doc = {
        "name": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32)",
        "source": source,
        "generator": "tools/make_smollm2_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "torch_dtype": "float32",
        "new_tokens": args.new_tokens,
        "eos_token_id": eos_id,
        "tolerance_note": (
            "transformers float32 on CPU over the dequantized weights. Greedy continues past <|im_end|> "
            "(no stop, no logit processors), so greedy[i] is the argmax of the raw logits after "
            "ids + greedy[:i]. A float32 engine should reproduce every greedy id whose margin is above "
            "~1e-3 and last_logits_top10 to ~1e-3 absolute."),
        "prompts": records,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote %s" % os.path.abspath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
