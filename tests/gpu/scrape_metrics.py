#!/usr/bin/env python3
"""The `metrics` stage of scripts/gpu-run: waits for the daemons it started,
sends a few completions, then scrapes the coordinator's and every worker's
/metrics, saving each scrape to OUT/metrics_<name>.txt and printing the
per-GPU memory, weight, KV, utilisation and latency series.

Usage: scrape_metrics.py TP OUT
Exits non-zero when the daemons are not ready, a completion fails, or a
worker's scrape lacks its GPU memory series.
"""
import json
import sys
import time
import urllib.error
import urllib.request

API = "http://127.0.0.1:18000"
KEYS = ("memory", "weight", "kv_cache", "utilization", "step_seconds_count", "step_seconds_sum",
        "ttft_seconds_count", "requests_total", "comm_seconds_count", "bubble", "tokens_total")


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def main():
    tp, out = int(sys.argv[1]), sys.argv[2]
    for _ in range(600):
        try:
            if get(API + "/readyz")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    else:
        sys.exit("daemons not ready after 120 s")
    model = json.loads(get(API + "/v1/models")[1])["data"][0]["id"]
    for i in range(8):
        body = json.dumps({"model": model, "prompt": [1, 5, 9, 14 + i], "max_tokens": 24,
                           "temperature": 0}).encode()
        req = urllib.request.Request(API + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                reply = json.loads(r.read())
        except urllib.error.HTTPError as e:
            sys.exit(f"completion {i}: HTTP {e.code}: {e.read().decode()}")
        print("completion", i, reply["choices"][0]["finish_reason"], reply["usage"])
    time.sleep(1.5)
    ok = True
    targets = [("coordinator", API + "/metrics")]
    targets += [(f"worker{g}", f"http://127.0.0.1:{19100 + g}/metrics") for g in range(tp)]
    for name, url in targets:
        status, text = get(url)
        with open(f"{out}/metrics_{name}.txt", "w") as f:
            f.write(text)
        print(f"== {name} {url} -> HTTP {status}")
        lines = [l for l in text.splitlines() if not l.startswith("#")]
        for line in lines:
            if any(k in line for k in KEYS):
                print(line)
        if name.startswith("worker") and not any("memory" in l and "uuid=\"GPU-" in l
                                                 for l in lines):
            print(f"{name}: no per-GPU memory series with a GPU uuid")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
