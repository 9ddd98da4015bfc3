#!/usr/bin/env python3
"""A compiled plain-PyTorch Llama: the "gpt-fast style" speed peer of tessera_bench.

  torch_peer.py --model DIR [--batches 1,16,64] [--prompt-len 128] [--new-tokens 64]
                [--prefill-len 1024] [--prefill-batch 4] [--device cuda|cpu]
                [--dtype bfloat16|float32] [--no-compile] [--check-against-hf N [--check-only]]

The model is written here from the config.json and *.safetensors of DIR (Llama, and the MoE
families Mixtral and Qwen3-MoE with torch_peer_moe.py's expert layer and Qwen3's q/k norms; the
checkpoints tests/gpu/hf_reference.py make writes): q|k|v in one Linear, gate|up in one
Linear, a static KV cache per layer ([batch, kv_heads, max_seq, head_dim], module buffers),
scaled_dot_product_attention (GQA through enable_gqa), RoPE and RMSNorm as HF Llama (rotate_half,
fp32 variance; rope types default, linear and llama3). Greedy (argmax), EOS ignored.

Compilation (engine "torch-compile"; "torch-eager" with --no-compile):
  decode    one step (forward + argmax) under torch.compile(mode="reduce-overhead",
            fullgraph=True, dynamic=False): CUDA graphs on cuda; on cpu mode "default"
            (CUDA graphs are CUDA-only). cudagraph_mark_step_begin() before every step and
            the sampled ids are cloned. One compilation per batch size.
  prefill   torch.compile(dynamic=False), mode "default" (no CUDA graphs): one compilation
            per [batch, length]. Prefill starts at position 0 and attends with is_causal over
            the new keys; only the last position goes through lm_head (as generate does).

Measures what hf_bench.py measures, with random prompt ids:
  load      safetensors -> model on the device, wall time, bytes of parameters
  prefill   one prefill over [prefill_batch, prefill_len] ids, tokens/s (after two warm-up
            calls of the same shape, which include its compilation)
  decode    ms per step = (time(N+1 tokens) - time(1 token)) / N, after two warm-up
            generations per batch (compilation and CUDA-graph recording excluded), each time
            the best of 3 (1 token) and 2 (N+1); tokens/s = batch / (ms per step);
            max_seq = prompt + new tokens, rounded up to 32
Prints one JSON object per line, like hf_bench.py.

--check-against-hf N (after the benchmarks): two fixed random prompts of 12 ids; N greedy ids
here (the compiled path) and from transformers' generate on the same model, device and dtype,
and the last-position logits of one eager prefill against transformers' forward. Prints a
"check" line: "match" (all ids equal), "logits_max_diff", and "agree", which decides the exit
status: in fp32 the ids are equal (or first differ where transformers' top1 - top2 margin is
under 1e-3); in bf16, where greedy ids of two correct engines part at near ties, our logits'
distance to transformers upcast to fp32 ("ours_vs_fp32") is at most twice transformers' own
bf16 distance ("hf_vs_fp32"), the noise floor tests/gpu/hf_reference.py also records.
"""

import argparse
import glob
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer_moe import MoeFFN, moe_config, moe_state  # noqa: E402


class Config:
    def __init__(self, d):
        self.sparse, self.qk_norm = set(), False
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise SystemExit("torch_peer.py: attention_bias / mlp_bias are not supported")
        self.dim = d["hidden_size"]
        self.inter = d["intermediate_size"]
        self.layers = d["num_hidden_layers"]
        self.heads = d["num_attention_heads"]
        self.kv_heads = d.get("num_key_value_heads") or self.heads
        self.head_dim = d.get("head_dim") or self.dim // self.heads
        self.eps = d.get("rms_norm_eps", 1e-6)
        self.vocab = d["vocab_size"]
        self.tied = d.get("tie_word_embeddings", False)
        self.max_pos = d.get("max_position_embeddings", 2048)
        # transformers 5 writes rope_parameters (with rope_theta inside), 4 rope_scaling.
        self.rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        self.theta = d.get("rope_theta", self.rope.get("rope_theta", 10000.0))
        if d.get("model_type", "llama") != "llama":
            moe_config(self, d)


def inv_freq(c, device):
    """HF Llama's rotary frequencies (default, linear and llama3 rope types)."""
    f = 1.0 / (c.theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64, device=device).float()
                           / c.head_dim))
    kind = c.rope.get("rope_type", c.rope.get("type", "default"))
    if kind == "linear":
        f = f / c.rope["factor"]
    elif kind == "llama3":
        factor, lo, hi = c.rope["factor"], c.rope["low_freq_factor"], c.rope["high_freq_factor"]
        old = c.rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        g = torch.where(wavelen > old / lo, f / factor, f)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * g / factor + smooth * g
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        f = torch.where(medium, smoothed, g)
    elif kind != "default":
        raise SystemExit(f"torch_peer.py: rope_type {kind} is not supported")
    return f


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wqkv = nn.Linear(c.dim, (c.heads + 2 * c.kv_heads) * c.head_dim, bias=False)
        self.wo = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        if c.qk_norm:  # Qwen3: RMSNorm over each head's q and k before RoPE
            self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.eps), RMSNorm(c.head_dim, c.eps)
        self.register_buffer("k_cache", None, persistent=False)  # setup_caches
        self.register_buffer("v_cache", None, persistent=False)

    def forward(self, x, cos, sin, pos):
        c, (b, t, _) = self.c, x.shape
        q, k, v = self.wqkv(x).split([c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                      c.kv_heads * c.head_dim], dim=-1)
        q, k = q.view(b, t, c.heads, c.head_dim), k.view(b, t, c.kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        gqa = c.heads != c.kv_heads
        if t > 1:  # prefill from position 0: causal over the new keys
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # decode: the whole static cache, positions after pos masked out
            mask = torch.arange(self.k_cache.shape[2], device=x.device) <= pos[-1]
            y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache,
                                               attn_mask=mask.view(1, 1, 1, -1), enable_gqa=gqa)
        return self.wo(y.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))


class Block(nn.Module):
    def __init__(self, c, sparse=False):
        super().__init__()
        self.inter = c.inter
        self.attn_norm = RMSNorm(c.dim, c.eps)
        self.attn = Attention(c)
        self.mlp_norm = RMSNorm(c.dim, c.eps)
        self.moe = MoeFFN(c) if sparse else None
        if not sparse:
            self.w13 = nn.Linear(c.dim, 2 * c.inter, bias=False)
            self.w2 = nn.Linear(c.inter, c.dim, bias=False)

    def forward(self, x, cos, sin, pos):
        x = x + self.attn(self.attn_norm(x), cos, sin, pos)
        if self.moe is not None:
            return x + self.moe(self.mlp_norm(x))
        gate, up = self.w13(self.mlp_norm(x)).split([self.inter, self.inter], dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(Block(c, i in c.sparse) for i in range(c.layers))
        self.norm = RMSNorm(c.dim, c.eps)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        self.register_buffer("cos", None, persistent=False)  # setup_caches
        self.register_buffer("sin", None, persistent=False)
        self.batch = self.max_seq = None

    def setup_caches(self, batch, max_seq):
        """Static KV caches and the cos/sin tables (HF: fp32, then the model's dtype)."""
        if (batch, max_seq) == (self.batch, self.max_seq):
            return
        self.batch, self.max_seq = batch, max_seq
        c, w = self.c, self.embed.weight
        for blk in self.blocks:  # drop the old caches before allocating the new ones
            blk.attn.k_cache = blk.attn.v_cache = None
        shape = (batch, c.kv_heads, max_seq, c.head_dim)
        for blk in self.blocks:
            blk.attn.k_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)
            blk.attn.v_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)
        n = max(max_seq, c.max_pos)
        freqs = torch.arange(n, device=w.device).float()[:, None] * inv_freq(c, w.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(w.dtype), emb.sin().to(w.dtype)

    def forward(self, ids, pos):
        """ids [b, t] at positions pos [t]; logits [b, vocab] of the last position."""
        x = self.embed(ids)
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        for blk in self.blocks:
            x = blk(x, cos, sin, pos)
        return self.lm_head(self.norm(x[:, -1]))


def load(model_dir, device, dtype):
    """Builds Llama from DIR's config.json and safetensors (sharded or not) on device."""
    from safetensors import safe_open

    with open(os.path.join(model_dir, "config.json")) as f:
        c = Config(json.load(f))
    with torch.device("meta"):
        model = Llama(c)
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise SystemExit(f"torch_peer.py: no *.safetensors in {model_dir}")
    hf = {}
    for path in files:
        with safe_open(path, framework="pt", device=str(device)) as f:
            for name in f.keys():
                hf[name] = f.get_tensor(name).to(dtype)
    sd = {"embed.weight": hf.pop("model.embed_tokens.weight"),
          "norm.weight": hf.pop("model.norm.weight")}
    sd["lm_head.weight"] = hf.pop("lm_head.weight", None)
    c.tied = c.tied or sd["lm_head.weight"] is None
    if c.tied:
        sd["lm_head.weight"] = sd["embed.weight"]
    for i in range(c.layers):
        p = f"model.layers.{i}."
        g = lambda n: hf.pop(p + n)  # noqa: E731
        sd[f"blocks.{i}.attn.wqkv.weight"] = torch.cat(
            [g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"), g("self_attn.v_proj.weight")])
        sd[f"blocks.{i}.attn.wo.weight"] = g("self_attn.o_proj.weight")
        if i in c.sparse:
            sd.update(moe_state(hf, p, i))
        else:
            sd[f"blocks.{i}.w13.weight"] = torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")])
            sd[f"blocks.{i}.w2.weight"] = g("mlp.down_proj.weight")
        if c.qk_norm:
            sd[f"blocks.{i}.attn.q_norm.weight"] = g("self_attn.q_norm.weight")
            sd[f"blocks.{i}.attn.k_norm.weight"] = g("self_attn.k_norm.weight")
        sd[f"blocks.{i}.attn_norm.weight"] = g("input_layernorm.weight")
        sd[f"blocks.{i}.mlp_norm.weight"] = g("post_attention_layernorm.weight")
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}
    if hf:
        raise SystemExit(f"torch_peer.py: unused tensors {sorted(hf)[:4]}...")
    model.load_state_dict(sd, assign=True, strict=True)
    if c.tied:
        model.lm_head.weight = model.embed.weight
    return model.eval()


class Generator:
    """Greedy generation with a compiled (or eager) prefill and decode step."""

    def __init__(self, model, device, compile_):
        self.model, self.device = model, device
        self.graphs = compile_ and device.type == "cuda"

        def prefill(ids, pos):
            return model(ids, pos).argmax(-1, keepdim=True)

        def step(ids, pos):
            return model(ids, pos).argmax(-1, keepdim=True)

        if compile_:
            cfg = torch._dynamo.config
            for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
                if hasattr(cfg, knob):
                    setattr(cfg, knob, max(getattr(cfg, knob), 64))
            prefill = torch.compile(prefill, fullgraph=True, dynamic=False)
            step = torch.compile(step, mode="reduce-overhead" if self.graphs else "default",
                                 fullgraph=True, dynamic=False)
        self.prefill, self.step = prefill, step

    def __call__(self, prompt, n, max_seq=None):
        """n greedy ids [b, n] after prompt [b, p]; the first comes from the prefill."""
        b, p = prompt.shape
        self.model.setup_caches(b, max_seq or -(-(p + n) // 32) * 32)
        nxt = self.prefill(prompt, torch.arange(p, device=self.device)).clone()
        out = [nxt]
        pos = torch.tensor([p], device=self.device)
        for _ in range(n - 1):
            if self.graphs:
                torch.compiler.cudagraph_mark_step_begin()
            nxt = self.step(nxt, pos).clone()
            out.append(nxt)
            pos = pos + 1
        return torch.cat(out, dim=1)


def check_against_hf(a, gen, device, dtype, vocab, out):
    """N greedy tokens and first-step logits here vs transformers; returns 0 when they agree."""
    from transformers import AutoModelForCausalLM

    g = torch.Generator().manual_seed(1234)
    prompt = torch.randint(3, vocab, (2, 12), generator=g).to(device)
    n = a.check_against_hf
    ours = gen(prompt, n).tolist()
    gen.model.setup_caches(2, 32)
    logits = gen.model(prompt, torch.arange(12, device=device)).float()  # eager forward
    hf = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(device).eval()
    r = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n,
                    min_new_tokens=n, eos_token_id=None, pad_token_id=0, output_scores=True,
                    return_dict_in_generate=True)
    theirs = r.sequences[:, prompt.shape[1]:].tolist()
    hf_logits = hf(prompt).logits[:, -1].float()
    near_tie = 1e-3
    rec = {"what": "check", "tokens": n, "dtype": str(dtype).split(".")[-1], "match": ours == theirs,
           "logits_max_diff": round(float((logits - hf_logits).abs().max()), 5)}
    for row, (x, y) in enumerate(zip(ours, theirs)):
        bad = [i for i in range(len(y)) if x[i] != y[i]]
        if bad:
            top = torch.topk(r.scores[bad[0]][row].float(), 2).values
            rec.setdefault("first_mismatch", []).append(
                {"row": row, "step": bad[0], "hf_margin": round(float(top[0] - top[1]), 4),
                 "hf_top": round(float(top[0]), 3)})
    if dtype == torch.float32:
        rec["agree"] = all(m["hf_margin"] < near_tie for m in rec.get("first_mismatch", []))
    else:  # the noise floor: both bf16 engines against transformers upcast to fp32
        ref = hf.float()(prompt).logits[:, -1]
        rec["ours_vs_fp32"] = round(float((logits - ref).abs().max()), 5)
        rec["hf_vs_fp32"] = round(float((hf_logits - ref).abs().max()), 5)
        rec["agree"] = rec["ours_vs_fp32"] <= 2 * rec["hf_vs_fp32"]
    rec.update({"ours": ours, "hf": theirs})
    out(rec)
    return 0 if rec["agree"] else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=1024)
    ap.add_argument("--prefill-batch", type=int, default=4)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--check-against-hf", type=int, default=0, metavar="N")
    ap.add_argument("--check-only", action="store_true", help="skip the benchmarks")
    a = ap.parse_args(argv)

    device = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    dtype = getattr(torch, a.dtype)
    cuda = device.type == "cuda"
    engine = "torch-eager" if a.no_compile else "torch-compile"

    def out(obj):
        obj.update({"engine": engine, "tp": 1})
        print(json.dumps(obj), flush=True)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load(a.model, device, dtype)
    sync()
    load_s = time.time() - t0
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated if cuda else (lambda: None)
    out({"what": "load", "seconds": round(load_s, 3), "weight_bytes_per_gpu": nbytes,
         "weight_bytes_by_device": {str(device): nbytes}, "gb_per_s": round(nbytes / load_s / 1e9, 2),
         "max_memory_allocated": peak()})
    gen = Generator(model, device, not a.no_compile)
    vocab = model.c.vocab
    g = torch.Generator().manual_seed(0)

    def ids(b, n):
        return torch.randint(3, vocab, (b, n), generator=g).to(device)

    def timed(x, n):
        sync()
        t = time.time()
        gen(x, n)
        sync()
        return time.time() - t

    if not a.check_only:
        x = ids(a.prefill_batch, a.prefill_len)
        timed(x, 1)  # warm-up (and compilation of this shape), twice
        timed(x, 1)
        dt = timed(x, 1)
        out({"what": "prefill", "batch": a.prefill_batch, "prompt": a.prefill_len, "seconds": round(dt, 4),
             "tokens_per_s": round(a.prefill_batch * a.prefill_len / dt, 1)})
        for b in [int(v) for v in a.batches.split(",")]:
            x = ids(b, a.prompt_len)
            tc = timed(x, a.new_tokens + 1)  # compile + CUDA-graph record, then a second warm-up
            timed(x, a.new_tokens + 1)
            t1 = min(timed(x, 1) for _ in range(3))
            tn = min(timed(x, a.new_tokens + 1) for _ in range(2))
            ms = 1e3 * (tn - t1) / a.new_tokens
            out({"what": "decode", "batch": b, "prompt": a.prompt_len, "new_tokens": a.new_tokens,
                 "ms_per_step": round(ms, 4), "tokens_per_s": round(1e3 * b / ms, 1),
                 "max_seq": model.max_seq, "warmup_s": round(tc, 2)})
        out({"what": "memory", "peak_bytes": peak()})
    if a.check_against_hf:
        return check_against_hf(a, gen, device, dtype, vocab, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
