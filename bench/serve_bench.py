#!/usr/bin/env python3
"""Serving benchmark: the daemons' streamed decode against the engine's (issues #36 and #33).

A fresh `tessera up` cluster (one replica, tp and pp from `--tp`/`--pp`, the model from
`--model`) per scheduler placement of `--runs-on` (`scheduler.runs_on`: "coordinator", the
coordinator schedules every step; "leader", the replica's leader worker does). On each, for every
client count of `--clients`, that many closed-loop clients each stream `--requests`
/v1/completions requests one after another: `--prompt-tokens` random token ids, greedy, EOS
ignored, `--max-tokens` generated (the workload of tessera_bench's decode rows).

Reported per (runs_on, clients): generated tokens per second over the run, TTFT p50/p99, the
gaps between a request's streamed chunks after its first (p50/p99: the streamed inter-token
latency a client sees; a chunk carries one step's token unless the client fell behind and
events were coalesced), and each request's mean inter-token time, (end - first token) /
(completion tokens - 1), p50. Greedy outputs of the same request under both placements are
compared: "identical_outputs" (bf16 GEMMs of differently shaped batches round differently on a
GPU, so there it is a report; on the CPU in fp32 they are equal).

Output: a JSON summary on stdout and in `--out`, a Markdown table in `--md`.

Dependencies: httpx (installed with the openai client by scripts/setup).

CPU (the bundled SmolLM2-135M, one worker):
  ~/.cache/tessera/venv/bin/python bench/serve_bench.py --model models/default --clients 1,8 \\
      --prompt-tokens 32 --max-tokens 32 --out bench/results/serve_cpu.json --md bench/results/serve_cpu.md
GPU: bash .gpu-bundle/gpu-run serve (scripts/gpu-run).
"""
import argparse
import asyncio
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefix_cache_bench import (add_cluster_arguments, cluster, compare,  # noqa: E402
                                percentile, run_clients)


def stats(results, elapsed):
    ttft = [r["ttft"] for r in results.values()]
    gaps, mean_itl = [], []
    tokens = 0
    for r in results.values():
        t = r["times"]
        gaps += [b - a for a, b in zip(t, t[1:])]
        n = r["usage"]["completion_tokens"] if r["usage"] else 0
        tokens += n
        if n > 1 and len(t) > 1:
            mean_itl.append((t[-1] - t[0]) / (n - 1))

    def ms(v):
        return None if v is None else round(1e3 * v, 3)

    return {"requests": len(results), "elapsed_seconds": round(elapsed, 3),
            "generated_tokens_per_second": round(tokens / elapsed, 1),
            "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
            "chunk_gap_p50_ms": ms(percentile(gaps, 50)), "chunk_gap_p99_ms": ms(percentile(gaps, 99)),
            "mean_itl_p50_ms": ms(percentile(mean_itl, 50))}


def run_placement(args, runs_on, prompts):
    cfg = argparse.Namespace(**vars(args))
    cfg.runs_on = runs_on
    cfg.clients = max(args.client_counts)
    rows, texts = [], {}
    with cluster(cfg, prefix_caching=False, prefix="tessera-serve-bench-") as (url, model):
        asyncio.run(run_clients(url, model, [prompts[0][:1]], args.max_tokens))  # warm-up
        for n in args.client_counts:
            results, elapsed = asyncio.run(run_clients(url, model, prompts[:n], args.max_tokens))
            row = {"runs_on": runs_on, "clients": n, **stats(results, elapsed)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            texts.update({f"{n}/{c}/{i}": r["pieces"] for (c, i), r in results.items()})
    return rows, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_cluster_arguments(ap, max_batch_tokens=4096)
    ap.add_argument("--clients", default="1,64,256", help="client counts, comma-separated")
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one at a time")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs-on", default="coordinator,leader",
                    help="scheduler.runs_on values to run, in order: coordinator, leader")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="also write the JSON summary here")
    ap.add_argument("--md", help="write a Markdown table here")
    args = ap.parse_args()
    try:
        args.client_counts = [int(c) for c in args.clients.split(",")]
    except ValueError:
        ap.error(f"--clients: {args.clients!r} is not a comma-separated list of counts")
    if min(args.client_counts) < 1:
        ap.error("--clients: every client count must be >= 1")
    if args.requests < 1:
        ap.error("--requests must be >= 1")
    if args.max_tokens < 2:
        ap.error("--max-tokens must be >= 2 (an inter-token time needs two tokens)")
    for r in args.runs_on.split(","):
        if r not in ("coordinator", "leader"):
            ap.error(f"--runs-on: {r!r} is not coordinator or leader")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model: {os.path.join(args.model, 'config.json')} does not exist")
    # write_config's workload fields: no shared system prompt, the prompt is the user part.
    args.system_tokens, args.user_tokens = 0, args.prompt_tokens

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(args.seed)
    lo, hi = min(1000, vocab // 4), min(vocab, 40000) - 1  # ordinary ids, no special tokens
    prompts = [[[rng.randint(lo, hi) for _ in range(args.prompt_tokens)]
                for _ in range(args.requests)] for _ in range(max(args.client_counts))]
    rows, texts = [], {}
    for runs_on in args.runs_on.split(","):
        r, t = run_placement(args, runs_on, prompts)
        rows += r
        texts[runs_on] = t
    summary = {"workload": {"model": os.path.abspath(args.model), "backend": args.backend,
                            "dtype": args.dtype, "tp": args.tp, "pp": args.pp,
                            "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                            "requests_per_client": args.requests},
               "rows": rows}
    if len(texts) == 2:
        a, b = texts.values()
        mismatches, first = compare(a, b)
        summary["identical_outputs"] = not mismatches and a.keys() == b.keys()
        summary["mismatched_requests"] = len(mismatches)
        summary["first_divergent_token"] = first[:16]
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write("| runs_on | clients | tok/s | TTFT p50 ms | TTFT p99 ms | chunk gap p50 ms | "
                    "chunk gap p99 ms | mean ITL p50 ms |\n|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['runs_on']} | {r['clients']} | {r['generated_tokens_per_second']} | "
                        f"{r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['chunk_gap_p50_ms']} | "
                        f"{r['chunk_gap_p99_ms']} | {r['mean_itl_p50_ms']} |\n")


if __name__ == "__main__":
    main()
