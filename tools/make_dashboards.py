#!/usr/bin/env python3
"""Writes the Grafana dashboards in dashboards/ (JSON, Grafana 9+ schema).

The dashboards are generated so that every panel follows one layout and the
templated variables (datasource, replica, node, gpu, stage) are the same everywhere.
Edit this file, run it, commit both:

    python3 tools/make_dashboards.py            # rewrites dashboards/*.json
    python3 tools/make_dashboards.py --check    # exit 1 when they are stale

tests/integration/observability_test.cc checks every expression against the metric
catalog (common/metrics/metric_catalog.cc) and runs it against a real Prometheus.
"""
import argparse
import json
import pathlib
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'replica=~"$replica", node=~"$node", gpu=~"$gpu", stage=~"$stage"'
RATE = "$__rate_interval"


def variables(with_rank_vars=True):
    out = [{
        "name": "datasource", "label": "Prometheus", "type": "datasource",
        "query": "prometheus", "current": {}, "hide": 0,
    }]
    if with_rank_vars:
        for name, label in (("replica", "Replica"), ("node", "Node"), ("gpu", "GPU"),
                            ("stage", "Stage")):
            out.append({
                "name": name, "label": label, "type": "query", "datasource": DS,
                "query": {"query": f"label_values(tessera_gpu_memory_used_bytes, {name})",
                          "refId": f"{name}-values"},
                "definition": f"label_values(tessera_gpu_memory_used_bytes, {name})",
                "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2,
                "sort": 3, "current": {"text": "All", "value": "$__all"}, "hide": 0,
            })
    return out


class Dash:
    def __init__(self, uid, title, description, rank_vars=True):
        self.uid, self.title, self.description = uid, title, description
        self.rank_vars = rank_vars
        self.panels = []
        self.x = self.y = 0
        self.row_h = 0
        self.next_id = 1

    def row(self, title):
        if self.x:
            self.y += self.row_h
            self.x = 0
        self.panels.append({"type": "row", "title": title, "id": self.next_id, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.next_id += 1
        self.y += 1
        self.row_h = 0

    def panel(self, title, targets, unit="short", kind="timeseries", w=12, h=8, stack=False,
              description="", repeat=None, overrides=None, minv=None, maxv=None):
        if self.x + w > 24:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0
        defaults = {"unit": unit}
        if minv is not None:
            defaults["min"] = minv
        if maxv is not None:
            defaults["max"] = maxv
        if kind == "timeseries":
            defaults["custom"] = {"stacking": {"mode": "normal" if stack else "none", "group": "A"},
                                  "fillOpacity": 30 if stack else 10, "lineWidth": 1,
                                  "showPoints": "never"}
        p = {
            "id": self.next_id, "type": kind, "title": title, "description": description,
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
            if kind == "timeseries" else {"reduceOptions": {"calcs": ["lastNotNull"]}},
            "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": l,
                         "datasource": DS} for i, (e, l) in enumerate(targets)],
        }
        if repeat:
            p["repeat"] = repeat
            p["repeatDirection"] = "h"
            p["maxPerRow"] = 2
        self.panels.append(p)
        self.next_id += 1
        self.x += w
        self.row_h = max(self.row_h, h)

    def json(self):
        return {
            "uid": self.uid, "title": self.title, "description": self.description,
            "tags": ["tessera"], "timezone": "browser", "schemaVersion": 38, "version": 1,
            "editable": True, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": variables(self.rank_vars)},
            "annotations": {"list": []}, "links": [
                {"type": "dashboards", "tags": ["tessera"], "asDropdown": True,
                 "title": "Tessera", "includeVars": True, "keepTime": True}],
            "panels": self.panels,
        }


def quantiles(metric, by="", sel="", qs=(0.5, 0.9, 0.99), legend_prefix=""):
    group = f"le{', ' + by if by else ''}"
    inner = f"{metric}_bucket{{{sel}}}" if sel else f"{metric}_bucket"
    out = []
    for q in qs:
        legend = f"{legend_prefix}p{int(q * 100)}" + "".join(f" {b}={{{{{b}}}}}" for b in by.split(", ") if b)
        out.append((f"histogram_quantile({q}, sum by ({group}) (rate({inner}[{RATE}])))", legend))
    return out


def cluster():
    d = Dash("tessera-cluster", "Tessera / Cluster overview",
             "Workers, plan, request rate and errors of one Tessera deployment.", rank_vars=False)
    d.row("Cluster")
    d.panel("Serving", [("max(tessera_ready)", "ready")], kind="stat", w=4, h=4,
            description="1 while a plan is loaded and serving.")
    d.panel("Plan version", [("max(tessera_plan_version)", "plan")], kind="stat", w=4, h=4)
    d.panel("Parallel layout", [("max by (dim) (tessera_plan_parallel_size)", "{{dim}}")],
            kind="stat", w=4, h=4)
    d.panel("Reconfigurations", [("sum(tessera_reconfigurations_total)", "re-plans")],
            kind="stat", w=4, h=4)
    d.panel("Workers serving", [('sum(tessera_workers{state="serving"})', "serving")],
            kind="stat", w=4, h=4)
    d.panel("Workers failed", [('sum(tessera_workers{state="failed"})', "failed")],
            kind="stat", w=4, h=4)
    d.panel("Workers by state", [("sum by (state) (tessera_workers)", "{{state}}")], stack=True)
    d.panel("Shard load time per rank",
            [("max by (replica, stage, tp_rank, node, gpu) (tessera_rank_load_seconds)",
              "replica {{replica}} stage {{stage}} tp {{tp_rank}} ({{node}}/{{gpu}})")],
            unit="s", kind="bargauge")
    d.panel("Shard bytes loaded per rank",
            [("max by (replica, stage, tp_rank, node, gpu) (tessera_rank_load_bytes)",
              "replica {{replica}} stage {{stage}} tp {{tp_rank}} ({{node}}/{{gpu}})")],
            unit="bytes", kind="bargauge")
    d.row("Traffic")
    d.panel("Requests per second by final status",
            [(f"sum by (status) (rate(tessera_requests_total[{RATE}]))", "{{status}}")],
            unit="reqps", stack=True)
    d.panel("Error ratio",
            [(f'sum(rate(tessera_requests_total{{status=~"error|rejected"}}[{RATE}])) / '
              f"clamp_min(sum(rate(tessera_requests_total[{RATE}])), 1e-9)", "errors + rejected")],
            unit="percentunit", minv=0, maxv=1)
    d.panel("Tokens per second",
            [(f"sum(rate(tessera_prompt_tokens_total[{RATE}]))", "prompt"),
             (f"sum(rate(tessera_generation_tokens_total[{RATE}]))", "generated")])
    d.panel("Time to first token", quantiles("tessera_request_ttft_seconds"), unit="s")
    return d


def gpu_memory():
    d = Dash("tessera-gpu-memory", "Tessera / GPU memory",
             "Where device memory goes on every GPU (CPU ranks: process memory): weights, KV "
             "cache and activations, stacked against the device total.")
    d.row("Per device")
    d.panel("Memory on $node GPU $gpu",
            [(f"sum by (node, gpu) (tessera_gpu_weight_bytes{{{SEL}}})", "weights"),
             (f"sum by (node, gpu) (tessera_gpu_kv_cache_capacity_bytes{{{SEL}}})", "KV cache"),
             (f"sum by (node, gpu) (tessera_gpu_activation_bytes{{{SEL}}})",
              "activations + workspace"),
             (f"sum by (node, gpu) (tessera_gpu_memory_total_bytes{{{SEL}}})", "total")],
            unit="bytes", stack=True, repeat="gpu",
            overrides=[{"matcher": {"id": "byName", "options": "total"},
                        "properties": [{"id": "custom.stacking", "value": {"mode": "none"}},
                                       {"id": "custom.fillOpacity", "value": 0},
                                       {"id": "custom.lineStyle",
                                        "value": {"fill": "dash", "dash": [10, 10]}}]}])
    d.row("All devices")
    d.panel("Memory used / total",
            [(f"tessera_gpu_memory_used_bytes{{{SEL}}} / tessera_gpu_memory_total_bytes{{{SEL}}}",
              "{{node}} gpu {{gpu}} (replica {{replica}} stage {{stage}} tp {{tp_rank}})")],
            unit="percentunit", minv=0, maxv=1)
    d.panel("Utilisation",
            [(f"tessera_gpu_utilization_ratio{{{SEL}}}", "{{node}} gpu {{gpu}}")],
            unit="percentunit", minv=0)
    d.panel("Weights per device",
            [(f"tessera_gpu_weight_bytes{{{SEL}}}",
              "{{node}} gpu {{gpu}} replica {{replica}} stage {{stage}} tp {{tp_rank}}")],
            unit="bytes", kind="bargauge")
    d.panel("KV cache used vs capacity",
            [(f"sum by (replica, stage, tp_rank) (tessera_kv_cache_used_bytes{{{SEL}}})",
              "used replica {{replica}} stage {{stage}} tp {{tp_rank}}"),
             (f"sum by (replica, stage, tp_rank) (tessera_gpu_kv_cache_capacity_bytes{{{SEL}}})",
              "capacity replica {{replica}} stage {{stage}} tp {{tp_rank}}")],
            unit="bytes")
    d.panel("Activations + workspace",
            [(f"tessera_gpu_activation_bytes{{{SEL}}}", "{{node}} gpu {{gpu}}")], unit="bytes")
    d.panel("Shard load progress",
            [(f"tessera_worker_load_bytes{{{SEL}}} / tessera_worker_load_total_bytes{{{SEL}}}",
              "{{node}} gpu {{gpu}}")],
            unit="percentunit", minv=0, maxv=1)
    return d


def latency():
    d = Dash("tessera-latency", "Tessera / Latency",
             "TTFT, inter-token latency, end-to-end latency and per-rank step latency at p50, p90 "
             "and p99.")
    d.row("Requests")
    d.panel("Time to first token", quantiles("tessera_request_ttft_seconds"), unit="s")
    d.panel("Inter-token latency", quantiles("tessera_request_inter_token_latency_seconds"), unit="s")
    d.panel("End-to-end latency", quantiles("tessera_request_e2e_latency_seconds"), unit="s")
    d.panel("Queue time", quantiles("tessera_request_queue_time_seconds"), unit="s")
    d.row("Steps")
    step_sel = f'{SEL}, phase="decode"'
    d.panel("Decode step latency",
            quantiles("tessera_step_duration_seconds", "replica, stage", step_sel), unit="s")
    step_sel = f'{SEL}, phase="prefill"'
    d.panel("Prefill step latency",
            quantiles("tessera_step_duration_seconds", "replica, stage", step_sel), unit="s")
    return d


def pipeline():
    d = Dash("tessera-pipeline", "Tessera / Pipeline",
             "Per-stage step time, pipeline bubble ratio and communication time by op, for "
             "each replica.")
    d.row("Stages")
    d.panel("Mean step time per stage",
            [(f"sum by (replica, stage, phase) "
              f"(rate(tessera_step_duration_seconds_sum{{{SEL}}}[{RATE}])) / "
              f"sum by (replica, stage, phase) "
              f"(rate(tessera_step_duration_seconds_count{{{SEL}}}[{RATE}]))",
              "replica {{replica}} stage {{stage}} {{phase}}")], unit="s")
    d.panel("p90 step time per stage",
            quantiles("tessera_step_duration_seconds", "replica, stage, phase", SEL, qs=(0.9,)),
            unit="s")
    d.panel("Pipeline bubble ratio (idle fraction)",
            [(f"avg by (replica, stage) (tessera_pipeline_bubble_ratio{{{SEL}}})",
              "replica {{replica}} stage {{stage}}")],
            unit="percentunit", minv=0, maxv=1)
    d.panel("Busy fraction per stage",
            [(f"sum by (replica, stage) (rate(tessera_stage_busy_seconds_total{{{SEL}}}[{RATE}])) / "
              f"clamp_min(sum by (replica, stage) "
              f"(rate(tessera_stage_busy_seconds_total{{{SEL}}}[{RATE}])) + "
              f"sum by (replica, stage) (rate(tessera_stage_idle_seconds_total{{{SEL}}}[{RATE}])), "
              f"1e-9)",
              "replica {{replica}} stage {{stage}}")], unit="percentunit", minv=0, maxv=1)
    d.panel("Tokens per second per stage",
            [(f"sum by (replica, stage, phase) (rate(tessera_step_tokens_total{{{SEL}}}[{RATE}]))",
              "replica {{replica}} stage {{stage}} {{phase}}")])
    d.row("Communication")
    d.panel("Communication time per second, by op",
            [(f"sum by (replica, stage, op) "
              f"(rate(tessera_comm_duration_seconds_sum{{{SEL}}}[{RATE}]))",
              "replica {{replica}} stage {{stage}} {{op}}")], unit="s", stack=True)
    d.panel("p90 communication call, by op",
            quantiles("tessera_comm_duration_seconds", "op", SEL, qs=(0.9,)), unit="s")
    d.panel("Communication bandwidth, by op",
            [(f"sum by (replica, stage, op) (rate(tessera_comm_bytes_total{{{SEL}}}[{RATE}]))",
              "replica {{replica}} stage {{stage}} {{op}}")], unit="Bps")
    # MoE models only: tokens routed to each expert (no series for a dense model).
    per_expert = (f"sum by (replica, stage, expert) "
                  f"(rate(tessera_moe_expert_tokens_total{{{SEL}}}[{RATE}]))")
    d.row("Mixture of experts")
    d.panel("Tokens per second per expert",
            [(per_expert, "replica {{replica}} stage {{stage}} expert {{expert}}")])
    d.panel("Expert imbalance (busiest expert / mean expert)",
            [(f"max by (replica, stage) ({per_expert}) / "
              f"clamp_min(avg by (replica, stage) ({per_expert}), 1e-9)",
              "replica {{replica}} stage {{stage}}")], minv=1)
    return d


def requests():
    d = Dash("tessera-requests", "Tessera / Requests and queue",
             "Scheduler state: running and waiting sequences, queue depth, preemptions, KV "
             "blocks, prefix cache hits.", rank_vars=False)
    d.row("Scheduler")
    d.panel("Sequences",
            [("sum(tessera_scheduler_running_sequences)", "running"),
             ("sum(tessera_scheduler_waiting_sequences)", "waiting")])
    d.panel("HTTP requests in flight (queue depth)",
            [("sum(tessera_scheduler_queue_depth)", "accepted, not answered")])
    d.panel("Preemptions per second",
            [(f"sum(rate(tessera_scheduler_preemptions_total[{RATE}]))", "preemptions")])
    d.panel("KV cache blocks",
            [("sum(tessera_kv_cache_used_blocks)", "used"),
             ("sum(tessera_kv_cache_capacity_blocks)", "capacity")])
    d.row("Prefix cache")
    d.panel("Prefix cache tokens per second",
            [(f"sum(rate(tessera_prefix_cache_queries_tokens_total[{RATE}]))", "looked up"),
             (f"sum(rate(tessera_prefix_cache_hits_tokens_total[{RATE}]))", "found (not prefilled)")],
            description="Tokens of admitted sequences looked up in the prefix cache, and those "
                        "found in cached KV blocks (kv_cache.prefix_caching).")
    d.panel("Prefix cache hit ratio",
            [(f"sum(rate(tessera_prefix_cache_hits_tokens_total[{RATE}])) / "
              f"clamp_min(sum(rate(tessera_prefix_cache_queries_tokens_total[{RATE}])), 1e-9)",
              "hit tokens / looked-up tokens")],
            unit="percentunit", minv=0, maxv=1)
    d.row("Requests")
    d.panel("Requests per second by final status",
            [(f"sum by (status) (rate(tessera_requests_total[{RATE}]))", "{{status}}")],
            unit="reqps", stack=True)
    d.panel("Non-finite logits (NaN/inf) per second",
            [(f"sum(rate(tessera_nonfinite_logits_total[{RATE}]))", "sequences failed")])
    d.panel("Queue time", quantiles("tessera_request_queue_time_seconds"), unit="s")
    d.panel("Prompt tokens per request",
            [(f"sum(rate(tessera_prompt_tokens_total[{RATE}])) / "
              f"clamp_min(sum(rate(tessera_requests_total[{RATE}])), 1e-9)", "prompt")])
    d.panel("Generated tokens per request",
            [(f"sum(rate(tessera_generation_tokens_total[{RATE}])) / "
              f"clamp_min(sum(rate(tessera_requests_total[{RATE}])), 1e-9)", "generated")])
    d.row("Replicas")
    d.panel("Sequences per replica",
            [("sum by (replica) (tessera_scheduler_running_sequences)",
              "running, replica {{replica}}"),
             ("sum by (replica) (tessera_scheduler_waiting_sequences)",
              "waiting, replica {{replica}}")],
            description="Running and waiting sequences of each data-parallel replica "
                        "(parallel.replicas): the router keeps their load balanced.")
    d.panel("KV cache use per replica",
            [("sum by (replica) (tessera_kv_cache_used_blocks) / "
              "clamp_min(sum by (replica) (tessera_kv_cache_capacity_blocks), 1)",
              "replica {{replica}}")],
            unit="percentunit",
            description="Share of each replica's KV blocks allocated to sequences.")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail when dashboards/ is stale")
    args = ap.parse_args()
    out_dir = pathlib.Path(__file__).resolve().parent.parent / "dashboards"
    stale = []
    for d in (cluster(), gpu_memory(), latency(), pipeline(), requests()):
        path = out_dir / f"{d.uid}.json"
        text = json.dumps(d.json(), indent=2) + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    if stale:
        print("stale (run tools/make_dashboards.py):", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
