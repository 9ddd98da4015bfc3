#!/usr/bin/env python3
"""Turns the JSON lines of tessera_bench, hf_bench.py and torch_peer.py into results.json and a
markdown table.

  summarize.py bench.jsonl [--out DIR] [--hbm-tb-s 4.8]

One row per (model, engine, tp): load time and GB/s, weight bytes per GPU, prefill
tokens/s, decode ms/token at batch 1, tokens/s at batch 16, 64, 128 and 256, peak memory,
and the fraction of the HBM roofline reached at batch 1:
  bytes of weights read per GPU per token / (ms per token * the datasheet bandwidth),
with --hbm-tb-s the card's datasheet figure (H200 4.8, H100 3.35). A measured device copy
({"what": "hbm_copy"}, scripts/gpu-run decode) is printed above the table.
"""

import argparse
import json
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--out", default=".")
    ap.add_argument("--hbm-tb-s", type=float, default=4.8)
    a = ap.parse_args(argv)
    rows = {}
    copies = []
    for line in open(a.jsonl):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("what") == "hbm_copy":
            copies.append(r["read_plus_write_tb_s"])
            continue
        engine = r.get("engine", "?")
        # hf_bench.py's 2-GPU modes: device_map="balanced" splits the layers
        # (naive model parallel), tp_plan="auto" is tensor parallel.
        gpus = r.get("tp", {"hf-balanced": 2, "hf-tp": 2}.get(engine, 1))
        key = (r.get("model", "?"), engine, gpus)
        row = rows.setdefault(key, {"model": key[0], "engine": key[1], "tp": key[2]})
        w = r.get("what")
        if w == "load":
            row["load_s"] = r["seconds"]
            row["weight_bytes_per_gpu"] = r.get("weight_bytes_per_gpu")
            if "gb_per_s" in r:
                row["load_gb_s"] = r["gb_per_s"]
        elif w == "prefill":
            row["prefill_tok_s"] = r["tokens_per_s"]
        elif w == "decode":
            row[f"decode_b{r['batch']}_ms"] = r["ms_per_step"]
            row[f"decode_b{r['batch']}_tok_s"] = r["tokens_per_s"]
        elif w == "memory":
            row["peak_bytes"] = r["peak_bytes"]
    for row in rows.values():
        wb, ms = row.get("weight_bytes_per_gpu"), row.get("decode_b1_ms")
        if wb and ms:
            row["roofline_b1"] = wb / (ms * 1e-3 * a.hbm_tb_s * 1e12)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(list(rows.values()), f, indent=1)

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    lines = []
    if copies:
        lines += [f"Device-to-device copy: {max(copies):.2f} TB/s reads + writes (measured); "
                  f"roofline at the datasheet {a.hbm_tb_s} TB/s.", ""]
    lines += ["| model | engine | GPUs | load s | weights GB/GPU | prefill tok/s | b1 ms/tok | b1 % HBM roofline "
              "| b16 tok/s | b64 tok/s | b128 tok/s | b256 tok/s | peak GB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(rows.values(), key=lambda r: (r["model"], r["engine"], r["tp"])):
        wb = row.get("weight_bytes_per_gpu")
        pk = row.get("peak_bytes")
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            row["model"], row["engine"], row["tp"], fmt(row.get("load_s"), ".2f"),
            fmt(wb / 1e9 if wb else None, ".2f"), fmt(row.get("prefill_tok_s"), ".0f"),
            fmt(row.get("decode_b1_ms"), ".2f"),
            fmt(100 * row["roofline_b1"] if "roofline_b1" in row else None, ".0f"),
            fmt(row.get("decode_b16_tok_s"), ".0f"), fmt(row.get("decode_b64_tok_s"), ".0f"),
            fmt(row.get("decode_b128_tok_s"), ".0f"), fmt(row.get("decode_b256_tok_s"), ".0f"),
            fmt(pk / 1e9 if pk else None, ".1f")))
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
