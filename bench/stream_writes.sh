#!/usr/bin/env bash
# Coordinator CPU per generated token, streamed (SSE, an event per token) and
# not, for two tessera-coordinator binaries in one run: `before` (e.g. one
# built from the commit before stream-write coalescing) and this build's
# (`after`). The fleet is bench/fleet_sim.sh's decode64: 8 simulated nodes,
# 64 replicas of Llama-2-7B shapes at tp1, 256 clients x 32-token requests,
# --time-scale 0 (the workers answer at once, so the coordinator is the work).
#
#   bash bench/stream_writes.sh BEFORE_COORDINATOR [build-dir] [load-seconds]
#
# Writes bench/results/stream_writes_<before|after>_<plain|stream>.json and
# prints a table (bench/results/stream_writes.md quotes it). The runs
# alternate (before plain, after plain, before stream, after stream, twice)
# so that load from elsewhere on the machine falls on both alike.
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: stream_writes.sh BEFORE_COORDINATOR [build-dir] [load-seconds]}
build=${2:-build}
seconds=${3:-15}
sim="$build/tessera-fleet-sim"
[ -x "$sim" ] || { echo "stream_writes.sh: $sim not built" >&2; exit 1; }
[ -x "$before" ] || { echo "stream_writes.sh: $before is not an executable" >&2; exit 1; }
out=bench/results
mkdir -p "$out"
tok=tests/fixtures/models/llama_gqa_f32
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), Linux $(uname -r)"
run() {
  local name=$1 coordinator=$2
  shift 2
  echo "stream_writes.sh: $name: $sim --coordinator $coordinator $*"
  "$sim" --coordinator "$coordinator" --tokenizer "$tok" --json "$out/stream_writes_$name.json" \
    --nodes 8 --tp 1 --pp 1 --model-config configs/models/llama-2-7b.json --time-scale 0 \
    --clients 256 --max-tokens 32 --idle-seconds 1 --load-seconds "$seconds" "$@" >/dev/null
}
for round in 1 2; do
  run "before_plain_$round" "$before"
  run "after_plain_$round" "$build/tessera-coordinator"
  run "before_stream_$round" "$before" --stream
  run "after_stream_$round" "$build/tessera-coordinator" --stream
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| coordinator | requests | round | tokens/s | events/s | events per write | coordinator cores | us CPU per token | failed |")
print("|---|---|---|---|---|---|---|---|---|")
for who in ("before", "after"):
    for kind in ("plain", "stream"):
        for rnd in (1, 2):
            x = json.load(open(f"{out}/stream_writes_{who}_{kind}_{rnd}.json"))["load"]
            w = x.get("tessera_http_stream_writes_total")  # "before" exports none
            per = f"{x['tessera_http_stream_events_total'] / w:.2f}" if w else "-"
            print(f"| {who} | {kind} | {rnd} | {x['tokens_per_second']:.0f} | "
                  f"{x['events'] / x['seconds']:.0f} | {per} | {x['coordinator_cores']:.2f} | "
                  f"{x['coordinator_us_per_token']:.2f} | {x['failed'] + x['short']} |")
PY
