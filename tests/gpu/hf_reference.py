#!/usr/bin/env python3
"""Random-weight Llama-family checkpoints and transformers references, made on the GPU machine.

  hf_reference.py make --out DIR [--hidden 4096 --layers 8 --heads 32 --kv-heads 32
                                  --intermediate 11008 --vocab 32000 --seed 0
                                  --family llama|qwen3|phi3|mistral|gemma2|gemma3_text|mixtral|qwen3_moe
                                  --sliding-window N --experts E --top-k K --moe-intermediate I]
      Builds the family's ForCausalLM (default Llama; qwen3: head_dim 128 and q/k
      norms; phi3: fused qkv/gate_up and longrope with original_max_position_embeddings
      256, so the 511-token prompt takes the long factors; mistral: --sliding-window,
      default 64, which every prompt but the shortest passes; gemma2: Gemma 2's
      soft-capping (50 on the scores, 30 on the logits) and --sliding-window on the
      even layers; gemma3_text: q/k norms, every sixth layer global, the sliding ones
      on rope_local_base_freq 10000, the global ones on linear rope x8; mixtral: --experts
      experts of --intermediate columns, top --top-k, every layer sparse; qwen3_moe: Qwen3
      attention, --experts experts of --moe-intermediate columns, top --top-k renormalised,
      every layer sparse) from a config
      with random weights directly on the GPU
      (normal, std = initializer_range 0.02; every RMSNorm weight 1 + 0.2 * randn, or
      0.2 * randn for Gemma's (1 + weight) norms, so a loader that leaves norms at 1
      fails) and saves it in bfloat16 with save_pretrained (safetensors shards).

  hf_reference.py reference --model DIR --out JSON [--positions 256]
      Loads DIR with transformers in bfloat16 on cuda:0 (eager attention for Gemma,
      whose soft-capping sdpa lacks) and records, for four random
      prompts (7, 33, 120 and 511 tokens): last-position logits, 16 greedy ids
      (generate, do_sample=False, no EOS) and the top1 - top2 margin at each step;
      and for one random sequence of --positions tokens the argmax and margin at
      every position of one forward pass (teacher forcing). The same model upcast to
      float32 then gives the fp32 values of the same quantities ("*_fp32"): the noise
      floor against which both bf16 engines are judged.

Deterministic given the seed (torch.manual_seed; prompts from numpy's default_rng).
"""

import argparse
import json
import os
import sys
import time


def make(args):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(args.seed)
    common = dict(hidden_size=args.hidden, intermediate_size=args.intermediate,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads,
                  num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                  max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, initializer_range=0.02,
                  bos_token_id=1, eos_token_id=2)
    if args.family == "qwen3":
        common.update(head_dim=128, attention_bias=False, use_sliding_window=False)
    elif args.family == "phi3":
        half = args.hidden // args.heads // 2
        common.update(original_max_position_embeddings=256, pad_token_id=None,
                      rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(half)],
                                    "long_factor": [1.0 + 0.5 * i for i in range(half)]})
    elif args.family == "mistral":
        common.update(sliding_window=args.sliding_window)
    elif args.family == "mixtral":
        common.update(num_local_experts=args.experts, num_experts_per_tok=args.top_k, sliding_window=None,
                      router_jitter_noise=0.0, output_router_logits=False)
    elif args.family == "qwen3_moe":
        common.update(head_dim=128, attention_bias=False, use_sliding_window=False, num_experts=args.experts,
                      num_experts_per_tok=args.top_k, moe_intermediate_size=args.moe_intermediate,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                      output_router_logits=False)
    elif args.family in ("gemma2", "gemma3_text"):
        head_dim = args.hidden // args.heads
        common.update(head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=args.sliding_window,
                      hidden_activation="gelu_pytorch_tanh", attention_bias=False, pad_token_id=0)
        if args.family == "gemma2":
            common.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        else:
            common.update(rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window_pattern=6,
                          rope_scaling={"rope_type": "linear", "factor": 8.0})
    if args.rope == "llama3":
        # Llama 3.1's rope: theta 500000, scaled x8 past 8192 positions, 128k context.
        common.update(rope_theta=500000.0, max_position_embeddings=131072,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    gemma = args.family in ("gemma2", "gemma3_text")
    cfg = AutoConfig.for_model(args.family, **common)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn_like(p, dtype=torch.float32))
                else:
                    p.normal_(0.0, cfg.initializer_range)
    torch.set_default_dtype(torch.float32)
    model.config.torch_dtype = torch.bfloat16
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, max_shard_size="4GB")
    nparams = sum(p.numel() for p in model.parameters())
    print(json.dumps({"made": args.out, "parameters": nparams, "seconds": round(time.time() - t0, 1)}))


def reference(args):
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    kwargs = {}
    if AutoConfig.from_pretrained(args.model).model_type in ("gemma2", "gemma3_text"):
        kwargs["attn_implementation"] = "eager"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, **kwargs).to("cuda:0").eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(1234)
    out = {"model": args.model, "dtype": "bfloat16", "device": torch.cuda.get_device_name(0),
           "transformers": __import__("transformers").__version__, "torch": torch.__version__,
           "prompts": []}
    with torch.no_grad():
        for n in (7, 33, 120, 511):
            ids = rng.integers(3, vocab, size=n).tolist()
            x = torch.tensor([ids], device="cuda:0")
            last = model(x).logits[0, -1].float().cpu()
            gen = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=16,
                                 min_new_tokens=16, eos_token_id=None, pad_token_id=0,
                                 output_scores=True, return_dict_in_generate=True)
            greedy = gen.sequences[0, n:].tolist()
            margins = []
            for s in gen.scores:
                top = torch.topk(s[0].float(), 2).values
                margins.append(float(top[0] - top[1]))
            out["prompts"].append({"ids": ids, "last_logits": last.tolist(), "greedy": greedy,
                                   "greedy_margins": margins})
        ids = rng.integers(3, vocab, size=args.positions).tolist()
        logits = model(torch.tensor([ids], device="cuda:0")).logits[0].float()
        top = torch.topk(logits, 2, dim=-1)
        out["positions"] = {"ids": ids, "top1": top.indices[:, 0].tolist(),
                            "margins": (top.values[:, 0] - top.values[:, 1]).tolist()}
        model = model.float()  # bf16 weights upcast exactly
        for p in out["prompts"]:
            x = torch.tensor([p["ids"]], device="cuda:0")
            p["last_logits_fp32"] = model(x).logits[0, -1].float().cpu().tolist()
        logits = model(torch.tensor([ids], device="cuda:0")).logits[0].float()
        top = torch.topk(logits, 2, dim=-1)
        out["positions"]["top1_fp32"] = top.indices[:, 0].tolist()
        out["positions"]["margins_fp32"] = (top.values[:, 0] - top.values[:, 1]).tolist()
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(json.dumps({"reference": args.out, "prompts": len(out["prompts"]), "positions": args.positions}))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--hidden", type=int, default=4096)
    m.add_argument("--layers", type=int, default=8)
    m.add_argument("--heads", type=int, default=32)
    m.add_argument("--kv-heads", type=int, default=32)
    m.add_argument("--intermediate", type=int, default=11008)
    m.add_argument("--vocab", type=int, default=32000)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--family", choices=["llama", "qwen3", "phi3", "mistral", "gemma2", "gemma3_text", "mixtral",
                                        "qwen3_moe"],
                   default="llama")
    m.add_argument("--sliding-window", type=int, default=64)
    m.add_argument("--experts", type=int, default=8)
    m.add_argument("--top-k", type=int, default=2)
    m.add_argument("--moe-intermediate", type=int, default=768)
    m.add_argument("--rope", choices=["default", "llama3"], default="default",
                   help="llama3: Llama 3.1's scaled rope and 131072 positions (llama family)")
    r = sub.add_parser("reference")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--positions", type=int, default=256)
    args = ap.parse_args(argv)
    make(args) if args.cmd == "make" else reference(args)


if __name__ == "__main__":
    sys.exit(main())
