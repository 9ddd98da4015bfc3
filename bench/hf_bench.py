#!/usr/bin/env python3
"""The Hugging Face transformers peers of tessera_bench, on the same model and GPUs.

  hf_bench.py --model DIR [--mode single|balanced|tp] [--batches 1,16,64]
              [--prompt-len 128] [--new-tokens 64] [--prefill-len 1024] [--prefill-batch 4]

Modes:
  single    transformers generate on cuda:0 (bf16, eager KV cache, greedy)
  balanced  accelerate device_map="balanced" over the visible GPUs (naive model parallel)
  tp        tp_plan="auto"; run under torchrun --nproc-per-node 2 (rank 0 prints)

Measures what tessera_bench measures, with random prompt ids and EOS ignored:
  load      from_pretrained wall time, bytes of parameters per GPU, torch.cuda memory
  prefill   one forward over [prefill_batch, prefill_len] ids, tokens/s (after a warm-up)
  decode    ms per step = (time(generate N+1 tokens) - time(generate 1 token)) / N, so the
            prefill is subtracted; tokens/s = batch / (ms per step)
Prints one JSON object per line, like tessera_bench.
"""

import argparse
import json
import os
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="single", choices=["single", "balanced", "tp"])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=1024)
    ap.add_argument("--prefill-batch", type=int, default=4)
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    rank = 0
    kw = {"dtype": torch.bfloat16}
    if a.mode == "tp":
        import torch.distributed as dist
        rank = int(os.environ.get("RANK", "0"))
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        kw["tp_plan"] = "auto"
    elif a.mode == "balanced":
        kw["device_map"] = "balanced"
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.model, **kw)
    if a.mode == "single":
        model = model.to("cuda:0")
    model.eval()
    torch.cuda.synchronize()
    load_s = time.time() - t0
    dev = model.device if a.mode != "balanced" else torch.device("cuda:0")
    per_gpu = {}
    for p in model.parameters():
        d = str(p.device)
        local = p.to_local() if hasattr(p, "to_local") else p
        per_gpu[d] = per_gpu.get(d, 0) + local.numel() * local.element_size()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def out(obj):
        if rank == 0:
            obj.update({"engine": "hf-" + a.mode, "tp": 1 if a.mode == "single" else 2})
            print(json.dumps(obj), flush=True)

    out({"what": "load", "seconds": round(load_s, 3), "weight_bytes_per_gpu": max(per_gpu.values()),
         "weight_bytes_by_device": per_gpu,
         "max_memory_allocated": torch.cuda.max_memory_allocated()})

    def ids(b, n):
        return torch.randint(3, vocab, (b, n), generator=g).to(dev)

    def sync():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)

    with torch.no_grad():
        x = ids(a.prefill_batch, a.prefill_len)
        model(x[:, :16])
        sync()
        t = time.time()
        model(x)
        sync()
        dt = time.time() - t
        out({"what": "prefill", "batch": a.prefill_batch, "prompt": a.prefill_len, "seconds": round(dt, 4),
             "tokens_per_s": round(a.prefill_batch * a.prefill_len / dt, 1)})

        def gen(x, n):
            sync()
            t = time.time()
            model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, eos_token_id=None, pad_token_id=0)
            sync()
            return time.time() - t

        for b in [int(v) for v in a.batches.split(",")]:
            x = ids(b, a.prompt_len)
            gen(x, 2)  # warm-up
            t1 = gen(x, 1)
            tn = gen(x, a.new_tokens + 1)
            ms = 1e3 * (tn - t1) / a.new_tokens
            out({"what": "decode", "batch": b, "prompt": a.prompt_len, "new_tokens": a.new_tokens,
                 "ms_per_step": round(ms, 4), "tokens_per_s": round(1e3 * b / ms, 1)})
    out({"what": "memory", "peak_bytes": torch.cuda.max_memory_allocated()})
    if a.mode == "tp":
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
