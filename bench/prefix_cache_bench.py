#!/usr/bin/env python3
"""Prefix-caching benchmark (issue #17): a shared system prompt, cache on and off.

The workload: every request is a `--system-tokens` (1,000) token system
prompt shared by all, followed by a `--user-tokens` (50) token user message
of its own, sent as token ids to /v1/completions (stream, greedy, EOS
ignored, `--max-tokens` generated). `--clients` (32) closed-loop clients
each send `--requests` requests one after another. The same run is made
twice on a fresh cluster: once with `kv_cache.prefix_caching = true` and
once with it off (`tessera up --config` with a written config, tp and pp
from `--tp`/`--pp`, the model from `--model`).

Reported per run: TTFT (request sent to its first streamed token) p50 and
p99, throughput (requests and generated tokens per second over the run),
the usage block's `prompt_tokens_details.cached_tokens` summed, and the
coordinator's tessera_prefix_cache_{queries,hits}_tokens_total. Every
request's generated text must be identical between the two runs (greedy);
the script exits 1 when it is not.

Output: a JSON summary on stdout and in `--out`, and a Markdown table in
`--md` when given.

Dependencies: httpx (installed with the openai client by scripts/setup).

CPU (the bundled SmolLM2-135M, one worker):
  ~/.cache/tessera/venv/bin/python bench/prefix_cache_bench.py --model models/default \\
      --requests 1 --out bench/results/prefix_cache_cpu.json --md bench/results/prefix_cache_cpu.md
"""
import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    # Nearest rank: the smallest value with at least q% of the samples at or below it.
    k = max(0, min(len(xs) - 1, int(-(-q * len(xs) // 100)) - 1))
    return xs[k]


def write_config(path, args, port, control, prefix_caching):
    ctx = args.system_tokens + args.user_tokens + args.max_tokens
    blocks_per_seq = -(-ctx // args.block_size)
    max_context = max(ctx, 2048)
    # The pool holds every client's sequence, and at least one of max_context.
    max_blocks = max(blocks_per_seq * args.clients, -(-max_context // args.block_size)) + 8
    with open(path, "w") as f:
        f.write(
            f'[model]\npath = "{os.path.abspath(args.model)}"\ndtype = "{args.dtype}"\n'
            f'chat_template = "chatml"\n'
            f"[parallel]\nmode = \"explicit\"\ntp = {args.tp}\npp = {args.pp}\n"
            f'[server]\nhost = "127.0.0.1"\nport = {port}\n'
            f'control_endpoint = "tcp://127.0.0.1:{control}"\n'
            f"[admin]\nport = 0\n"
            f"[heartbeat]\ninterval_seconds = 1.0\ntimeout_seconds = {args.heartbeat_timeout}\n"
            f"[kv_cache]\nmemory_fraction = {args.memory_fraction}\n"
            f"block_size = {args.block_size}\n"
            f"max_blocks = {max_blocks}\n"
            f"prefix_caching = {'true' if prefix_caching else 'false'}\n"
            f"[scheduler]\nmax_context = {max_context}\nqueue_limit = {4 * args.clients}\n"
            f"max_sequences = {args.clients}\nmax_batch_tokens = {args.max_batch_tokens}\n"
            f"prefill_chunk_tokens = {args.prefill_chunk_tokens}\n"
            + (f'runs_on = "{args.runs_on}"\n' if getattr(args, "runs_on", None) else "")
            + f'[worker]\nbackend = "{args.backend}"\n')


def wait_ready(url, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the cluster exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url}/readyz not ready after {timeout} s")


def scrape(url, names):
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        for n in names:
            if line.startswith(n + " ") or line.startswith(n + "{"):
                out[n] = out.get(n, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def one_request(client, url, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    text = []
    times = []  # when each chunk with text arrived (bench/serve_bench.py's inter-token gaps)
    usage = None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            j = json.loads(data)
            if "error" in j:
                raise RuntimeError(f"stream error: {j['error']}")
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t0
                text.append(c.get("text", ""))
                times.append(now)
    return {"ttft": ttft, "e2e": time.perf_counter() - t0, "text": "".join(text), "pieces": text,
            "usage": usage, "times": times}


async def run_clients(url, model, prompts, max_tokens):
    results = {}
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=len(prompts))
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:
        async def client_loop(c):
            for i, p in enumerate(prompts[c]):
                results[(c, i)] = await one_request(client, url, model, p, max_tokens)

        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(c) for c in range(len(prompts))))
        elapsed = time.perf_counter() - t0
    return results, elapsed


def make_prompts(args, vocab):
    rng = random.Random(args.seed)
    # Ids from the middle of the vocab: ordinary tokens, no special ones.
    lo, hi = 1000, min(vocab, 40000) - 1
    system = [rng.randint(lo, hi) for _ in range(args.system_tokens)]
    return [[system + [rng.randint(lo, hi) for _ in range(args.user_tokens)]
             for _ in range(args.requests)] for _ in range(args.clients)]


@contextlib.contextmanager
def cluster(args, prefix_caching, prefix="tessera-prefix-bench-"):
    """A fresh `tessera up` with write_config's config, ready; yields (url, model id). On a
    failure the end of its log is printed and its folder kept; it is stopped either way."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    port, control = free_port(), free_port()
    config = os.path.join(tmp, "bench.toml")
    write_config(config, args, port, control, prefix_caching)
    url = f"http://127.0.0.1:{port}"
    log_path = os.path.join(tmp, "tessera-up.log")
    proc = subprocess.Popen([args.tessera, "up", "--config", config], stdout=open(log_path, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(url, proc, 600)
        yield url, httpx.get(url + "/v1/models").json()["data"][0]["id"]
    except BaseException:
        with open(log_path, errors="replace") as f:
            tail = f.readlines()[-10:]
        print(f"the cluster's log ({log_path}) ends:\n" + "".join(tail), file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    shutil.rmtree(tmp, ignore_errors=True)


def run_once(args, prompts, prefix_caching):
    with cluster(args, prefix_caching) as (url, model):
        # One request alone first, so both runs start from the same state:
        # with the cache on it leaves the system prompt cached, as a
        # long-running server would have it.
        warm = asyncio.run(run_clients(url, model, [[prompts[0][0]]], args.max_tokens))[0]
        results, elapsed = asyncio.run(run_clients(url, model, prompts, args.max_tokens))
        names = ["tessera_prefix_cache_queries_tokens_total",
                 "tessera_prefix_cache_hits_tokens_total"]
        counters = scrape(url, names)
    ttfts = [r["ttft"] for r in results.values()]
    tokens = sum(r["usage"]["completion_tokens"] for r in results.values() if r["usage"])
    cached = sum(r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
                 for r in results.values() if r["usage"])
    prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in results.values() if r["usage"])
    return {
        "prefix_caching": prefix_caching,
        "requests": len(results),
        "elapsed_seconds": round(elapsed, 3),
        "ttft_p50_seconds": round(percentile(ttfts, 50), 4),
        "ttft_p99_seconds": round(percentile(ttfts, 99), 4),
        "ttft_mean_seconds": round(statistics.mean(ttfts), 4),
        "requests_per_second": round(len(results) / elapsed, 4),
        "generated_tokens_per_second": round(tokens / elapsed, 3),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "prefix_cache_queries_tokens_total": counters.get(names[0], 0.0),
        "prefix_cache_hits_tokens_total": counters.get(names[1], 0.0),
        "warmup_ttft_seconds": round(warm[(0, 0)]["ttft"], 4),
        "texts": {f"{c}/{i}": r["pieces"] for (c, i), r in results.items()},
    }


def compare(a, b):
    """Mismatched request keys, and each one's first differing generated token."""
    mismatches = sorted(k for k in a if a[k] != b.get(k))
    first = []
    for k in mismatches:
        x, y = a[k], b.get(k, [])
        first.append(next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y))))
    return mismatches, first


def add_cluster_arguments(ap, max_batch_tokens):
    """The options of the cluster write_config writes (bench/serve_bench.py shares them)."""
    ap.add_argument("--model", required=True, help="model directory (models/default)")
    ap.add_argument("--tessera", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                        "tessera"), help="the tessera binary")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--backend", default="cpu", help="worker.backend: cpu or cuda")
    ap.add_argument("--dtype", default="float32", help="model.dtype")
    ap.add_argument("--memory-fraction", type=float, default=0.5)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-batch-tokens", type=int, default=max_batch_tokens)
    ap.add_argument("--heartbeat-timeout", type=float, default=600.0,
                    help="heartbeat.timeout_seconds: a step may take up to this + 30 s on a "
                         "loaded CPU host before its worker counts as lost")
    ap.add_argument("--prefill-chunk-tokens", type=int, default=512)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_cluster_arguments(ap, max_batch_tokens=1024)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--user-tokens", type=int, default=50)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one at a time")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--order", default="on,off",
                    help="which runs, in order: on or off, a trailing digit repeats one (off2)")
    ap.add_argument("--out", help="also write the JSON summary here")
    ap.add_argument("--md", help="write a Markdown table here")
    args = ap.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = make_prompts(args, vocab)
    runs = {}
    for name in args.order.split(","):
        print(f"prefix_caching={name}: running", file=sys.stderr, flush=True)
        runs[name] = run_once(args, prompts, name.startswith("on"))
        r = runs[name]
        print(f"prefix_caching={name}: ttft p50 {r['ttft_p50_seconds']} s, p99 "
              f"{r['ttft_p99_seconds']} s, {r['requests_per_second']} req/s", file=sys.stderr,
              flush=True)
    identical = None
    mismatches = []
    first_divergence = []
    if "on" in runs and "off" in runs:
        a, b = runs["on"]["texts"], runs["off"]["texts"]
        mismatches, first_divergence = compare(a, b)
        identical = not mismatches and a.keys() == b.keys()
    # Repeats of a run (--order on,off,off2): the run-to-run noise floor of the
    # same configuration, which tells a cache defect from batch-dependent
    # rounding (bf16 GEMMs of a different batch shape round differently).
    repeats = {}
    for name in runs:
        base = name.rstrip("0123456789")
        if name != base and base in runs:
            m, f = compare(runs[base]["texts"], runs[name]["texts"])
            repeats[f"{base} vs {name}"] = {"mismatched_requests": len(m),
                                            "first_divergent_token": f}
    summary = {
        "workload": {"system_tokens": args.system_tokens, "user_tokens": args.user_tokens,
                     "clients": args.clients, "requests_per_client": args.requests,
                     "max_tokens": args.max_tokens, "model": os.path.abspath(args.model),
                     "tp": args.tp, "pp": args.pp, "backend": args.backend, "dtype": args.dtype,
                     "block_size": args.block_size, "prefill_chunk_tokens":
                     args.prefill_chunk_tokens, "max_batch_tokens": args.max_batch_tokens},
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "texts"} for k, v in runs.items()},
        "identical_outputs": identical,
        "mismatched_requests": mismatches,
        "first_divergent_token": first_divergence,
        "repeats": repeats,
    }
    if identical is not None:
        on, off = runs["on"], runs["off"]
        summary["ttft_p50_speedup"] = round(off["ttft_p50_seconds"] / on["ttft_p50_seconds"], 2)
        summary["ttft_p99_speedup"] = round(off["ttft_p99_seconds"] / on["ttft_p99_seconds"], 2)
        summary["throughput_speedup"] = round(
            on["requests_per_second"] / off["requests_per_second"], 2)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.md:
        w = summary["workload"]
        lines = [f"# Prefix caching, {w['backend']} ({os.path.basename(w['model'])}, "
                 f"tp {w['tp']} x pp {w['pp']}, {w['dtype']})", "",
                 f"{w['clients']} clients x {w['requests_per_client']} requests: a "
                 f"{w['system_tokens']}-token shared system prompt + a {w['user_tokens']}-token "
                 f"user message each, {w['max_tokens']} tokens generated (greedy).", "",
                 "| prefix_caching | TTFT p50 s | TTFT p99 s | req/s | generated tok/s | "
                 "cached / prompt tokens |", "|---|---|---|---|---|---|"]
        for k, r in summary["runs"].items():
            lines.append(f"| {k} | {r['ttft_p50_seconds']} | {r['ttft_p99_seconds']} | "
                         f"{r['requests_per_second']} | {r['generated_tokens_per_second']} | "
                         f"{r['cached_tokens']} / {r['prompt_tokens']} |")
        if identical is not None:
            lines += ["", f"TTFT p50 {summary['ttft_p50_speedup']}x lower, p99 "
                      f"{summary['ttft_p99_speedup']}x, throughput "
                      f"{summary['throughput_speedup']}x with the cache; outputs identical: "
                      f"{identical}."]
        if first_divergence:
            lines.append(f"The {len(mismatches)} differing requests first differ at generated "
                         f"token {min(first_divergence)} to {max(first_divergence)} "
                         f"(median {statistics.median(first_divergence)}).")
        for k, r in repeats.items():
            lines.append(f"Repeat {k}: {r['mismatched_requests']} of {len(prompts) * args.requests}"
                         " requests differ.")
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")
    if identical is False:
        print(f"outputs differ for {len(mismatches)} requests: {mismatches[:5]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
