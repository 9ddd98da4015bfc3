#!/usr/bin/env bash
# The fleet benchmark of issue #21: one real tessera-coordinator and up to
# 1,024 simulated DGX H100 nodes (8,192 workers, each with its own CURVE key)
# on this machine (bench/fleet_sim/, tessera-fleet-sim).
#
#   bash bench/fleet_sim.sh [build-dir]        # about 4 minutes on 2 cores
#
# Each run writes bench/results/fleet_sim_<name>.json:
#   full       1,024 nodes, Llama-2-70B shapes at tp8 x pp2 (512 replicas), modeled
#              load (50 GB/s: the page cache) and step times: registration, planning,
#              heartbeats alone, requests under load, one node killed under load, memory;
#   route512   the same fleet with --time-scale 0 (workers answer at once): requests
#              per second through the router over 512 replicas;
#   route64    64 replicas of Llama-2-7B at tp1 (8 nodes), --time-scale 0, 1-token
#              requests: the router's request rate, and the coordinator's CPU per step;
#   decode64   the same fleet, 256 clients x 32-token requests: CPU per step when
#              steps carry many sequences.
# route64 and decode64 give the coordinator's cost per step and per token (a
# least-squares line through their CPU per step against tokens per step), hence
# the steps per second one coordinator process can drive (docs/architecture.md,
# "One coordinator at fleet scale"). bench/results/fleet_sim.md quotes them.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sim="$build/tessera-fleet-sim"
[ -x "$sim" ] || { echo "fleet_sim.sh: $sim not built (bash scripts/setup)" >&2; exit 1; }
out=bench/results
mkdir -p "$out"
tok=tests/fixtures/models/llama_gqa_f32
machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), Linux $(uname -r)"
echo "machine: $machine"
run() {
  local name=$1
  shift
  echo "fleet_sim.sh: $name: $sim $*"
  "$sim" --tokenizer "$tok" --json "$out/fleet_sim_$name.json" "$@" >/dev/null
}
run full --nodes 1024 --tp 8 --pp 2 --disk-gbps 50 --clients 64 --max-tokens 4 \
  --idle-seconds 10 --load-seconds 30 --kill-node 5 --kill-after 5
run route512 --nodes 1024 --tp 8 --pp 2 --time-scale 0 --clients 64 --max-tokens 4 \
  --idle-seconds 1 --load-seconds 20
run route64 --nodes 8 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json --time-scale 0 \
  --clients 64 --max-tokens 1 --idle-seconds 1 --load-seconds 20
run decode64 --nodes 8 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json --time-scale 0 \
  --clients 256 --max-tokens 32 --idle-seconds 1 --load-seconds 20
python3 - "$out" "$machine" <<'PY'
import json, sys
out, machine = sys.argv[1], sys.argv[2]
r = {n: json.load(open(f"{out}/fleet_sim_{n}.json")) for n in ("full", "route512", "route64", "decode64")}
for name, x in r.items():
    load = x["load"]
    print(f"{name}: ok {x['ok']}, workers {x['workers']}, replicas {x['replicas']}, "
          f"registration {x['registration_seconds']:.2f} s, plan {x['plan_seconds']:.2f} s, "
          f"ready {x['ready_seconds']:.2f} s, idle {x['idle_coordinator_cores']:.3f} core, "
          f"{load['requests_per_second']:.0f} req/s, {load['steps_per_second']:.0f} steps/s, "
          f"{load['coordinator_us_per_step']:.0f} us CPU/step at {load['coordinator_cores']:.2f} core, "
          f"failed {load['failed']}, short {load['short']}, RSS {x['coordinator_rss_bytes'] / 1e6:.0f} MB")
print("node loss:", json.dumps(r["full"].get("node_loss")))
# CPU per step = a + b x tokens per step, through route64 and decode64.
pts = []
for n in ("route64", "decode64"):
    load = r[n]["load"]
    tps = load["tokens_per_second"] / load["steps_per_second"]
    pts.append((tps, load["coordinator_us_per_step"]))
(t1, c1), (t2, c2) = pts
b = (c2 - c1) / (t2 - t1)
a = c1 - b * t1
print(f"coordinator CPU per step: {a:.0f} us + {b:.1f} us per token "
      f"(tokens per step {t1:.1f} and {t2:.1f}); one core drives {1e6 / (a + 64 * b):.0f} steps/s "
      f"of 64 tokens")
print(f"machine: {machine}")
PY
