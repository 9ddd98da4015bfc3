#!/usr/bin/env python3
"""Helpers for tools/lm_eval_check.sh: a recording proxy and the transformers comparison.

proxy   -- a loopback HTTP proxy between lm-eval and Tessera's API that appends every
           request and response body to a JSONL file (one object per exchange:
           {"method", "path", "request", "status", "response"}), so the report can show
           exactly what lm-eval sent and which requests Tessera refused. It writes the port
           it bound to --port-file once it listens.
compare -- reads lm-eval's --log_samples output (samples_<task>_*.jsonl) and recomputes every
           request's log-likelihood with transformers in float32 on CPU: the sum over the
           continuation tokens of log_softmax(logits at the previous position) (log_softmax
           in float64), the context and continuation split into tokens as lm-eval does
           (lm_eval.api.model.TemplateLM._encode_pair: trailing spaces of the context move to
           the continuation; continuation tokens = tokens(context + continuation) minus the
           first len(tokens(context))). It also checks that the token ids lm-eval sent
           (from the proxy's log) are these sequences, and compares every prompt token's
           log-probability that Tessera returned (echo) with transformers'. Prints a table,
           writes a Markdown section and exits 1 when the largest per-example difference
           exceeds --tolerance (or a request was refused, or the tokens differ).

Needs the lm-eval venv (torch, transformers); see tools/README.md.
"""

import argparse
import glob
import http.client
import http.server
import json
import math
import os
import sys
import threading
import urllib.parse

# ---- proxy ----


def run_proxy(args):
    upstream = urllib.parse.urlsplit(args.upstream)
    lock = threading.Lock()
    log = open(args.log, "a", encoding="utf-8")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # quiet: the JSONL log is the record
            pass

        def _forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=600)
            headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            with lock:
                log.write(json.dumps({"method": self.command, "path": self.path,
                                      "request": _maybe_json(body), "status": resp.status,
                                      "response": _maybe_json(data)}) + "\n")
                log.flush()
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _forward
        do_POST = _forward

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, args.port_file)
    server.serve_forever()


def _maybe_json(raw):
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


# ---- compare ----


def load_samples(samples_dir):
    """Returns [(doc_id, choice_index, context, continuation, lm_eval_loglik, is_greedy)]."""
    files = sorted(glob.glob(os.path.join(samples_dir, "**", "samples_*.jsonl"), recursive=True))
    if not files:
        sys.exit(f"compare: no samples_*.jsonl under {samples_dir} (did lm_eval run with "
                 "--log_samples --output_path?)")
    rows = []
    with open(files[-1], encoding="utf-8") as f:
        for line in f:
            s = json.loads(line)
            args = s["arguments"]
            if isinstance(args, dict):  # {"gen_args_0": {"arg_0": ctx, "arg_1": cont}, ...}
                pairs = [(a["arg_0"], a["arg_1"]) for _, a in
                         sorted(args.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))]
            else:
                pairs = [(a[0], a[1]) for a in args]
            resps = s["resps"]
            if len(resps) != len(pairs):
                sys.exit(f"compare: {files[-1]} doc {s['doc_id']}: {len(pairs)} arguments but "
                         f"{len(resps)} responses")
            for k, ((ctx, cont), r) in enumerate(zip(pairs, resps)):
                # resps[k] = [(loglikelihood, is_greedy)], written as strings by lm-eval's
                # sanitize_list (str(float) round-trips; the bool is "True" or "False").
                ll, greedy = r[0] if isinstance(r[0], list) else r
                rows.append((s["doc_id"], k, ctx, cont, float(ll), greedy in (True, "True")))
    return files[-1], rows


def encode_pair(tok, context, continuation):
    """lm_eval.api.model.TemplateLM._encode_pair with add_special_tokens=False."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctx = tok(context, add_special_tokens=False).input_ids
    return whole[:len(ctx)], whole[len(ctx):]


def read_requests(log_path):
    """The proxy log: [(prompt token ids, echoed token_logprobs)] and the refused exchanges."""
    seen, refused, bodies = [], [], []
    if not log_path or not os.path.exists(log_path):
        return seen, refused, bodies
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            ex = json.loads(line)
            if ex["path"].split("?")[0] != "/v1/completions" or ex["method"] != "POST":
                continue
            bodies.append((ex["request"], ex["response"]))
            if ex["status"] != 200:
                refused.append(ex)
                continue
            prompts = ex["request"]["prompt"]
            if prompts and isinstance(prompts[0], int):
                prompts = [prompts]
            choices = sorted(ex["response"]["choices"], key=lambda c: c["index"])
            for ids, choice in zip(prompts, choices):
                seen.append((tuple(ids), choice["logprobs"]["token_logprobs"]))
    return seen, refused, bodies


def run_compare(args):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    samples_file, rows = load_samples(args.samples_dir)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    cache = {}

    def logprobs_of(ids):
        key = tuple(ids)
        if key not in cache:
            with torch.no_grad():
                logits = model(torch.tensor([list(ids)])).logits[0].double()
            cache[key] = torch.log_softmax(logits, dim=-1)
        return cache[key]

    table, sent = [], []
    for doc, k, ctx, cont, ll, greedy in rows:
        ctx_ids, cont_ids = encode_pair(tok, ctx, cont)
        ids = ctx_ids + cont_ids
        sent.append(tuple(ids))
        lp = logprobs_of(ids)
        ref = sum(float(lp[i - 1, ids[i]]) for i in range(len(ctx_ids), len(ids)))
        ref_greedy = all(int(lp[i - 1].argmax()) == ids[i] for i in range(len(ctx_ids), len(ids)))
        table.append({"doc": doc, "choice": k, "continuation": cont, "ctx_tokens": len(ctx_ids),
                      "cont_tokens": len(cont_ids), "lm_eval": ll, "transformers": ref,
                      "diff": abs(ll - ref), "greedy": greedy, "ref_greedy": ref_greedy})

    seen, refused, bodies = read_requests(args.requests_log)
    token_diff, token_count = 0.0, 0
    for ids, token_logprobs in seen:
        lp = logprobs_of(ids)
        for i in range(1, len(ids)):
            got = token_logprobs[i]
            token_diff = max(token_diff, abs(float(got) - float(lp[i - 1, ids[i]])))
            token_count += 1
    unmatched = sorted(set(sent) - {ids for ids, _ in seen}) if args.requests_log else []

    max_diff = max(r["diff"] for r in table)
    greedy_mismatch = sum(r["greedy"] != r["ref_greedy"] for r in table)
    ok = (max_diff <= args.tolerance and not refused and not unmatched
          and not any(math.isnan(r["lm_eval"]) for r in table))
    lines = format_report(args, samples_file, table, max_diff, greedy_mismatch, token_diff,
                          token_count, len(seen), refused, unmatched, bodies, ok)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0 if ok else 1


def format_report(args, samples_file, table, max_diff, greedy_mismatch, token_diff, token_count,
                  n_seen, refused, unmatched, bodies, ok):
    out = ["## Per-example log-likelihoods: lm-eval (Tessera) vs transformers", "",
           f"Samples: lm-eval's `{os.path.basename(samples_file)}`; {len(table)} requests "
           f"(doc, choice); tolerance {args.tolerance:g}.", "",
           "| doc | choice | continuation | ctx tok | cont tok | lm-eval via Tessera | "
           "transformers fp32 | abs diff | greedy (lm-eval / ref) |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in table:
        cont = json.dumps(r["continuation"])[1:-1].replace("|", "\\|")
        out.append(f"| {r['doc']} | {r['choice']} | `{cont}` | {r['ctx_tokens']} | "
                   f"{r['cont_tokens']} | {r['lm_eval']:.6f} | {r['transformers']:.6f} | "
                   f"{r['diff']:.2e} | {r['greedy']} / {r['ref_greedy']} |")
    out += ["",
            f"- **max abs difference per example: {max_diff:.3e}** (tolerance {args.tolerance:g})",
            f"- is_greedy disagreements: {greedy_mismatch}",
            f"- echoed prompt tokens compared one by one: {token_count} tokens in {n_seen} "
            f"prompts, max abs difference {token_diff:.3e}",
            f"- completions requests: {len(bodies)}; refused (non-200): {len(refused)}",
            f"- sequences lm-eval scored that no request carried (tokenization mismatch): "
            f"{len(unmatched)}"]
    if bodies:
        request, response = bodies[0]
        out += ["", "First request body lm-eval sent to /v1/completions:", "", "```json",
                json.dumps(request), "```", "", "Tessera's answer, choice 0 (lm-eval sums "
                "`token_logprobs[ctxlen:-1]`; the last entry is the generated token):", "",
                "```json", json.dumps(response["choices"][0] if isinstance(response, dict)
                                      and response.get("choices") else response), "```"]
        keys = sorted({k for b, _ in bodies if isinstance(b, dict) for k in b})
        out += ["", "Fields across all requests: " + ", ".join(f"`{k}`" for k in keys)]
    for ex in refused[:5]:
        out += ["", f"Refused ({ex['status']}):", "", "```json", json.dumps(ex["request"]),
                json.dumps(ex["response"]), "```"]
    out += ["", f"Result: **{'PASS' if ok else 'FAIL'}**", ""]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("proxy", help="record lm-eval's requests to Tessera")
    p.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8000")
    p.add_argument("--port-file", required=True)
    p.add_argument("--log", required=True, help="JSONL file of request/response bodies")
    c = sub.add_parser("compare", help="lm-eval's log-likelihoods vs transformers")
    c.add_argument("--samples-dir", required=True, help="lm_eval --output_path")
    c.add_argument("--model", required=True, help="Hugging Face checkpoint folder")
    c.add_argument("--requests-log", help="the proxy's JSONL log")
    c.add_argument("--tolerance", type=float, default=1e-4)
    c.add_argument("--out", help="Markdown file to append the report to")
    args = ap.parse_args()
    if args.cmd == "proxy":
        run_proxy(args)
        return 0
    return run_compare(args)


if __name__ == "__main__":
    sys.exit(main())
