#!/usr/bin/env bash
# The fleet benchmark of issue #21: one real tessera-coordinator and 1,024
# simulated DGX H100 nodes (8,192 workers, each with its own CURVE key) on
# this machine, serving Llama-2-70B shapes at tp8 x pp2 (512 replicas).
#
#   bash bench/fleet_sim.sh [build-dir]        # ~3 minutes on 2 cores
#
# Runs, each into bench/results/fleet_sim_<name>.json:
#   full     registration, planning, heartbeats, routing under load, the loss of
#            one node under load, memory (modeled load and step times);
#   steps    the same fleet at --time-scale 0 (workers answer at once): the
#            steps per second one coordinator process drives, and its CPU per step;
#   routing  64 replicas of Llama-2-7B at tp1 (8 nodes), --time-scale 0:
#            requests per second through the router.
# bench/results/fleet_sim.md quotes the figures; docs/architecture.md ("Steps
# through one coordinator") the limit.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sim="$build/tessera-fleet-sim"
[ -x "$sim" ] || { echo "fleet_sim.sh: $sim not built (bash scripts/setup)" >&2; exit 1; }
out=bench/results
mkdir -p "$out"
machine="$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
echo "machine: $machine"

"$sim" --nodes 1024 --tp 8 --pp 2 --clients 64 --max-tokens 4 --idle-seconds 10 \
  --load-seconds 30 --kill-node 5 --kill-after 5 --json "$out/fleet_sim_full.json" >/dev/null
"$sim" --nodes 1024 --tp 8 --pp 2 --time-scale 0 --clients 128 --max-tokens 16 --idle-seconds 1 \
  --load-seconds 20 --json "$out/fleet_sim_steps.json" >/dev/null
"$sim" --nodes 8 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json --time-scale 0 --clients 128 --max-tokens 1 --idle-seconds 1 \
  --load-seconds 20 --json "$out/fleet_sim_routing.json" >/dev/null
python3 - "$out" "$machine" <<'PY'
import json, sys
out, machine = sys.argv[1], sys.argv[2]
for name in ("full", "steps", "routing"):
    r = json.load(open(f"{out}/fleet_sim_{name}.json"))
    load = r.get("load", {})
    print(f"{name}: workers {r.get('workers')}, registration {r.get('registration_seconds', -1):.2f} s, "
          f"plan {r.get('plan_seconds', -1):.2f} s, ready {r.get('ready_seconds', -1):.2f} s, "
          f"replicas {r.get('replicas')}, idle coordinator {r.get('idle_coordinator_cores', 0):.3f} core, "
          f"{load.get('requests_per_second', 0):.0f} req/s, {load.get('steps_per_second', 0):.0f} steps/s, "
          f"{load.get('coordinator_us_per_step', 0):.1f} us CPU/step, failed {load.get('failed')}, "
          f"RSS {r.get('coordinator_rss_bytes', 0) / 1e6:.0f} MB, node loss {r.get('node_loss')}")
PY
