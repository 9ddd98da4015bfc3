#!/usr/bin/env python3
"""Open-loop load test of a Tessera cluster (issue #8, section 4).

1. Capacity: a closed loop of `--concurrency` streaming clients for
   `--capacity-seconds` measures the completed requests per second. By
   default as many clients as the scheduler runs sequences at once
   (`scheduler.max_sequences` of the config), so the batch is full and the
   figure is the cluster's throughput, not that of a few clients.
2. Overload: Poisson arrivals at `--overload` x that capacity for
   `--duration` seconds, each a streamed /v1/chat/completions request.
   Every request ends in exactly one bucket: completed (finish_reason and
   `data: [DONE]`), rejected (HTTP 429 with an OpenAI error body: the queue is
   full) or failed (anything else, with the reason).
3. While it runs, the resident memory (VmRSS) of the coordinator and every
   worker is sampled once a second.

With `--launch CONFIG` the script starts the cluster itself with
`tessera up --config CONFIG` and stops it afterwards; with `--model DIR` it
writes that config first (free ports, explicit tp/pp); with `--url` it
attaches to a running coordinator (memory is then sampled for `--pids`).

Output: a JSON summary on stdout (and in `--out`). `--check` exits non-zero
unless every request is accounted for, no daemon died, the overload phase
saw 429s, and no daemon's RSS grew by more than `--max-rss-growth` (a
fraction) between the end of the first and the last quarter of the run.

Dependencies: httpx (installed with the openai client by scripts/setup).
"""
import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about GPUs.",
    "Explain pipeline parallelism in one sentence.",
    "List three prime numbers.",
    "What does a KV cache store?",
    "Say hello in Spanish.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def descendants(pid):
    """Every live descendant pid of `pid` (from /proc/*/stat parent links)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def process_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class Stats:
    def __init__(self):
        self.completed = 0
        self.rejected = 0
        self.failed = 0
        self.failures = {}
        self.ttft = []
        self.e2e = []
        self.tokens = 0

    def fail(self, why):
        self.failed += 1
        self.failures[why] = self.failures.get(why, 0) + 1


async def one_request(client, url, model, max_tokens, stats, rng):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    start = time.monotonic()
    first = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code == 429:
                text = (await r.aread()).decode(errors="replace")
                err = json.loads(text).get("error", {})
                if not err.get("message"):
                    stats.fail("429 without an error message")
                else:
                    stats.rejected += 1
                return
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                stats.fail(f"HTTP {r.status_code}: {text[:120]}")
                return
            done = finished = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    stats.fail("error event: " + str(chunk["error"].get("message", ""))[:120])
                    return
                choice = chunk["choices"][0]
                if choice.get("delta", {}).get("content"):
                    if first is None:
                        first = time.monotonic()
                    stats.tokens += 1
                if choice.get("finish_reason"):
                    finished = True
            if done and finished:
                stats.completed += 1
                stats.ttft.append((first or time.monotonic()) - start)
                stats.e2e.append(time.monotonic() - start)
            else:
                stats.fail("stream ended without finish_reason and [DONE]")
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError) as e:
        stats.fail(f"{type(e).__name__}: {str(e)[:120]}")


async def closed_loop(url, model, max_tokens, concurrency, seconds, seed):
    stats = Stats()
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def loop():
            while time.monotonic() < deadline:
                await one_request(client, url, model, max_tokens, stats, rng)
        start = time.monotonic()
        await asyncio.gather(*[loop() for _ in range(concurrency)])
        elapsed = time.monotonic() - start
    return stats, elapsed


async def open_loop(url, model, max_tokens, rate, seconds, seed, pids, sample_every):
    stats = Stats()
    rng = random.Random(seed)
    samples = []  # (t, {pid: rss})
    sent = 0
    tasks = []
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.monotonic()
        next_arrival = start
        next_sample = start
        while True:
            now = time.monotonic()
            if now - start >= seconds:
                break
            if now >= next_sample:
                samples.append((now - start, {p: rss_bytes(p) for p in pids}))
                next_sample += sample_every
            if now >= next_arrival:
                tasks.append(asyncio.ensure_future(
                    one_request(client, url, model, max_tokens, stats, rng)))
                sent += 1
                next_arrival += rng.expovariate(rate)
                continue
            await asyncio.sleep(min(next_arrival, next_sample) - now)
        if tasks:
            await asyncio.gather(*tasks)
        samples.append((time.monotonic() - start, {p: rss_bytes(p) for p in pids}))
        elapsed = time.monotonic() - start
    return stats, sent, samples, elapsed


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100.0 * len(xs)))]


def write_config(path, model, tp, pp, port, control, queue_limit, max_sequences, max_context):
    with open(path, "w") as f:
        f.write(
            f'[model]\npath = "{model}"\nchat_template = "chatml"\n'
            f"[parallel]\ntp = {tp}\npp = {pp}\n"
            f'[server]\nport = {port}\ncontrol_endpoint = "tcp://127.0.0.1:{control}"\n'
            f"[admin]\nport = 0\n"
            f"[heartbeat]\ninterval_seconds = 0.5\ntimeout_seconds = 10.0\n"
            f"[kv_cache]\nmax_blocks = 512\nblock_size = 16\n"
            f"[scheduler]\nmax_context = {max_context}\nqueue_limit = {queue_limit}\n"
            f"max_sequences = {max_sequences}\n")


def wait_ready(url, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the cluster exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url}/readyz not ready after {timeout} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running coordinator, http://HOST:PORT")
    ap.add_argument("--launch", help="start `tessera up --config FILE` and stop it afterwards")
    ap.add_argument("--model", help="write a config for this model directory and launch it")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--queue-limit", type=int, default=16)
    ap.add_argument("--max-sequences", type=int, default=8)
    ap.add_argument("--max-context", type=int, default=128)
    ap.add_argument("--tessera", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                        "tessera"), help="the tessera binary")
    ap.add_argument("--served-model", default="", help='"model" field (default: /v1/models)')
    ap.add_argument("--pids", default="", help="comma-separated pids to sample with --url")
    ap.add_argument("--concurrency", type=int, default=0,
                    help="closed-loop clients (default: the config's scheduler.max_sequences; "
                         "32 with --url)")
    ap.add_argument("--capacity-seconds", type=float, default=30)
    ap.add_argument("--duration", type=float, default=300, help="overload seconds")
    ap.add_argument("--overload", type=float, default=1.5, help="arrival rate / capacity")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="also write the JSON summary here")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the checks pass")
    ap.add_argument("--max-rss-growth", type=float, default=0.10)
    args = ap.parse_args()

    proc = None
    tmp = None
    url = args.url
    if args.model:
        tmp = tempfile.mkdtemp(prefix="tessera-load-")
        port = free_port()
        args.launch = os.path.join(tmp, "load.toml")
        write_config(args.launch, os.path.abspath(args.model), args.tp, args.pp, port,
                     free_port(), args.queue_limit, args.max_sequences, args.max_context)
        url = f"http://127.0.0.1:{port}"
    if args.launch:
        import tomllib
        with open(args.launch, "rb") as f:
            config = tomllib.load(f)
        if not url:
            url = f"http://127.0.0.1:{config.get('server', {}).get('port', 8000)}"
        if args.concurrency <= 0:  # the scheduler's default max_sequences is 128
            args.concurrency = int(config.get("scheduler", {}).get("max_sequences", 128))
        log = open(os.path.join(tmp or tempfile.gettempdir(), "tessera-up.log"), "w")
        proc = subprocess.Popen([args.tessera, "up", "--config", args.launch], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    if not url:
        ap.error("give --url, --launch or --model")
    if args.concurrency <= 0:
        args.concurrency = 32
    try:
        wait_ready(url, proc, 180)
        pids = [int(p) for p in args.pids.split(",") if p]
        if proc is not None:
            pids = [p for p in descendants(proc.pid)
                    if process_name(p).startswith("tessera-")]
        names = {p: f"{process_name(p)}:{p}" for p in pids}
        model = args.served_model or httpx.get(url + "/v1/models").json()["data"][0]["id"]

        cap_stats, cap_elapsed = asyncio.run(closed_loop(
            url, model, args.max_tokens, args.concurrency, args.capacity_seconds, args.seed))
        capacity = cap_stats.completed / cap_elapsed
        if capacity <= 0:
            raise SystemExit(f"capacity phase completed nothing: {cap_stats.failures}")
        rate = capacity * args.overload
        stats, sent, samples, elapsed = asyncio.run(open_loop(
            url, model, args.max_tokens, rate, args.duration, args.seed + 1, pids, 1.0))
        alive = {p: rss_bytes(p) is not None for p in pids}
        if proc is not None and proc.poll() is not None:
            alive["tessera up"] = False
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    # RSS growth: the mean over the last quarter against the mean over the
    # first quarter after warm-up (the second quarter of the samples).
    rss = {}
    n = len(samples)
    for p in pids:
        series = [s[1][p] for s in samples if s[1].get(p)]
        if len(series) < 4:
            continue
        q = max(1, len(series) // 4)
        early = statistics.mean(series[q:2 * q])
        late = statistics.mean(series[-q:])
        rss[names[p]] = {
            "start_bytes": series[0], "max_bytes": max(series), "end_bytes": series[-1],
            "growth": (late - early) / early}
    accounted = stats.completed + stats.rejected + stats.failed
    summary = {
        "capacity_requests_per_s": round(capacity, 3),
        "capacity_phase": {"completed": cap_stats.completed, "failed": cap_stats.failed,
                           "seconds": round(cap_elapsed, 1), "concurrency": args.concurrency},
        "arrival_rate_per_s": round(rate, 3),
        "overload_seconds": round(elapsed, 1),
        "sent": sent, "completed": stats.completed, "rejected_429": stats.rejected,
        "failed": stats.failed, "failures": stats.failures, "accounted": accounted,
        "generated_tokens": stats.tokens,
        "ttft_p50_s": percentile(stats.ttft, 50), "ttft_p99_s": percentile(stats.ttft, 99),
        "e2e_p50_s": percentile(stats.e2e, 50), "e2e_p99_s": percentile(stats.e2e, 99),
        "rss_samples": n, "rss": rss, "daemons_alive": all(alive.values()),
        "max_tokens": args.max_tokens, "overload_factor": args.overload,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.check:
        problems = []
        if accounted != sent:
            problems.append(f"{sent - accounted} of {sent} requests unaccounted for")
        if stats.failed:
            problems.append(f"{stats.failed} requests failed: {stats.failures}")
        if not summary["daemons_alive"]:
            problems.append(f"a daemon died: {alive}")
        if stats.rejected == 0:
            problems.append("no 429 under overload (the queue limit never bit)")
        if stats.completed == 0:
            problems.append("nothing completed under overload")
        for name, r in rss.items():
            if r["growth"] > args.max_rss_growth:
                problems.append(f"{name} RSS grew {r['growth']:.1%}")
        if problems:
            print("load test FAILED: " + "; ".join(problems), file=sys.stderr)
            return 1
        print("load test passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
