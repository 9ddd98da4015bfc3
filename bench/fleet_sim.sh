#!/usr/bin/env bash
# The fleet benchmark of issue #21: one real tessera-coordinator and up to
# 1,024 simulated DGX H100 nodes (8,192 workers, each with its own CURVE key)
# on this machine (bench/fleet_sim/, tessera-fleet-sim).
#
#   bash bench/fleet_sim.sh [build-dir]        # about 5 minutes on 2 cores
#
# Environment: FLEET_SIM_RUNS picks runs ("route512 route64"; default all),
# FLEET_SIM_SUFFIX is added to each result's name (fleet_sim_<name><suffix>.json),
# FLEET_SIM_BIN runs another simulator binary (a before/after comparison)
# against the build's coordinator.
#
# Each run writes bench/results/fleet_sim_<name><suffix>.json:
#   full       1,024 nodes, Llama-2-70B shapes at tp8 x pp2 (512 replicas), modeled
#              load (50 GB/s: the page cache) and step times: registration, planning,
#              heartbeats alone, requests under load, one node killed under load, memory;
#   route512   the same fleet with --time-scale 0 (workers answer at once): requests
#              per second through the router over 512 replicas;
#   route512t1 the same with 1-token requests (one step each, as route64): the
#              coordinator's CPU per request over 512 replicas of tp8 x pp2;
#   route512t1leader  route512t1 with runs_on = "leader": a request costs the
#              coordinator one routing decision, one Generate to the replica's
#              leader and its updates (issue #33's routing target: 10,000
#              requests/s per coordinator core over 512 replicas);
#   route64    64 replicas of Llama-2-7B at tp1 (8 nodes), --time-scale 0, 1-token
#              requests: the router's request rate, and the coordinator's CPU per step;
#   decode64   the same fleet, 256 clients x 32-token requests: CPU per step when
#              steps carry many sequences;
#   decode64leader  decode64 with scheduler.runs_on = "leader": each simulated
#              replica leader runs the real ReplicaLeader (scheduler, output
#              processing); the coordinator's CPU per token beside decode64's.
#   decode8leader   decode8 with runs_on = "leader": the same clients on 8 replicas,
#              so each step carries about 8 times the sequences of decode64leader's;
#              with no per-step work the coordinator's CPU per token is the same.
# route64 and decode64 give the coordinator's CPU per step and per request
# (two equations, two unknowns), hence the steps per second one coordinator
# process can drive (docs/architecture.md, "One coordinator at fleet scale").
# bench/results/fleet_sim.md quotes them.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sim=${FLEET_SIM_BIN:-$build/tessera-fleet-sim}
coordinator="$build/tessera-coordinator"
runs=${FLEET_SIM_RUNS:-full route512 route512t1 route512t1leader route64 decode64 decode64leader decode8 decode8leader}
suffix=${FLEET_SIM_SUFFIX:-}
[ -x "$sim" ] || { echo "fleet_sim.sh: $sim not built (bash scripts/setup)" >&2; exit 1; }
[ -x "$coordinator" ] || { echo "fleet_sim.sh: $coordinator not built (bash scripts/setup)" >&2; exit 1; }
out=bench/results
mkdir -p "$out"
tok=tests/fixtures/models/llama_gqa_f32
machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), Linux $(uname -r)"
echo "machine: $machine"
run() {
  local name=$1
  shift
  case " $runs " in *" $name "*) ;; *) return 0 ;; esac
  echo "fleet_sim.sh: $name: $sim $*"
  "$sim" --coordinator "$coordinator" --tokenizer "$tok" --json "$out/fleet_sim_$name$suffix.json" \
    "$@" >/dev/null
}
run full --nodes 1024 --tp 8 --pp 2 --disk-gbps 50 --clients 64 --max-tokens 4 \
  --idle-seconds 10 --load-seconds 30 --kill-node 5 --kill-after 5
run route512 --nodes 1024 --tp 8 --pp 2 --time-scale 0 --clients 64 --max-tokens 4 \
  --idle-seconds 1 --load-seconds 20
run route512t1 --nodes 1024 --tp 8 --pp 2 --time-scale 0 --clients 64 --max-tokens 1 \
  --idle-seconds 1 --load-seconds 20
run route512t1leader --nodes 1024 --tp 8 --pp 2 --time-scale 0 --clients 64 --max-tokens 1 \
  --idle-seconds 1 --load-seconds 20 --runs-on leader
run route64 --nodes 8 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json --time-scale 0 \
  --clients 64 --max-tokens 1 --idle-seconds 1 --load-seconds 20
run decode64 --nodes 8 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json --time-scale 0 \
  --clients 256 --max-tokens 32 --idle-seconds 1 --load-seconds 20
run decode64leader --nodes 8 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json \
  --time-scale 0 --clients 256 --max-tokens 32 --idle-seconds 1 --load-seconds 20 --runs-on leader
run decode8 --nodes 1 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json --time-scale 0 \
  --clients 256 --max-tokens 32 --idle-seconds 1 --load-seconds 20
run decode8leader --nodes 1 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json \
  --time-scale 0 --clients 256 --max-tokens 32 --idle-seconds 1 --load-seconds 20 --runs-on leader
python3 - "$out" "$machine" "$runs" "$suffix" <<'PY'
import json, sys
out, machine, runs, suffix = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
names = [n for n in ("full", "route512", "route512t1", "route512t1leader", "route64", "decode64", "decode64leader", "decode8",
                     "decode8leader")
         if n in runs]
r = {n: json.load(open(f"{out}/fleet_sim_{n}{suffix}.json")) for n in names}
for name, x in r.items():
    load = x["load"]
    print(f"{name}: ok {x['ok']}, workers {x['workers']}, replicas {x['replicas']}, "
          f"registration {x['registration_seconds']:.2f} s, plan {x['plan_seconds']:.2f} s, "
          f"ready {x['ready_seconds']:.2f} s, idle {x['idle_coordinator_cores']:.3f} core, "
          f"{load['requests_per_second']:.0f} req/s, {load['steps_per_second']:.0f} steps/s, "
          f"{load['coordinator_us_per_step']:.0f} us CPU/step at {load['coordinator_cores']:.2f} core, "
          f"failed {load['failed']}, short {load['short']}, RSS {x['coordinator_rss_bytes'] / 1e6:.0f} MB")
    print(f"  simulator {load['simulator_cores']:.2f} core (threads: "
          + ", ".join(f"{k} {v:.2f}" for k, v in load.get("simulator_threads_cores", {}).items() if v >= 0.01)
          + f"), coordinator {load['coordinator_cores']:.2f} core (busiest thread "
          + f"{load.get('coordinator_busiest_thread', {}).get('cores', 0):.2f}), "
          + f"{1e6 * load['coordinator_cores'] / max(load['requests_per_second'], 1e-9):.0f} us "
          + f"coordinator CPU per request")
if "full" in r: print("node loss:", json.dumps(r["full"].get("node_loss")))
# Issue #33's per-step term: with the replicas scheduling themselves, the same
# clients in steps of about 4 (decode64leader) or 32 sequences (decode8leader)
# should cost the coordinator the same CPU per token (within 10%).
if "decode64leader" in r and "decode8leader" in r:
    per = {n: 1e6 * r[n]["load"]["coordinator_cores"] / max(r[n]["load"]["tokens_per_second"], 1e-9)
           for n in ("decode64leader", "decode8leader")}
    spt = {n: r[n]["load"]["tokens_per_second"] / max(r[n]["load"]["steps_per_second"], 1e-9)
           for n in per}
    print(f"leaders: coordinator CPU per token {per['decode64leader']:.2f} us (decode64leader, "
          f"{spt['decode64leader']:.1f} tokens a step) vs {per['decode8leader']:.2f} us (decode8leader, "
          f"{spt['decode8leader']:.1f} tokens a step): ratio {per['decode8leader'] / per['decode64leader']:.2f}")
# Coordinator CPU (cores) = a x steps/s + b x tokens/s + c x requests/s, solved
# through route64 (1-token requests), decode64 (about 4 sequences a step) and
# decode8 (about 32 a step), by Cramer's rule.
if not all(n in r for n in ("route64", "decode64", "decode8")):
    print(f"machine: {machine}")
    sys.exit(0)
rows = [(r[n]["load"]["steps_per_second"], r[n]["load"]["tokens_per_second"],
         r[n]["load"]["requests_per_second"], r[n]["load"]["coordinator_cores"])
        for n in ("route64", "decode64", "decode8")]
def det3(m):
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
m = [list(row[:3]) for row in rows]
d = det3(m)
a, b, c = (det3([[row[3] if k == col else row[k] for k in range(3)] for row in rows]) / d for col in range(3))
print(f"coordinator CPU: {a * 1e6:.0f} us per step + {b * 1e6:.1f} us per token + {c * 1e6:.0f} us per request")
for tokens in (8, 64):
    print(f"  a step of {tokens} tokens: {(a + tokens * b) * 1e6:.0f} us, so one core drives "
          f"{1 / (a + tokens * b):.0f} such steps/s ({tokens / (a + tokens * b):.0f} tokens/s)")
for n in names:
    rp = r[n]["load"].get("routed_per_replica")
    if rp: print(f"{n}: requests routed per replica min {rp['min']}, max {rp['max']}")
print(f"machine: {machine}")
PY
