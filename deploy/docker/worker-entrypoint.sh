#!/usr/bin/env bash
# Container entrypoint of a worker pod: one tessera-worker per GPU of the
# pod (TESSERA_GPUS, default: every GPU nvidia-smi lists); GPU i serves its
# metrics on worker.metrics_port + i. Exits when any worker exits, so the
# orchestrator restarts the pod as a whole (its ranks fail together).
#
# Environment: TESSERA_CONFIG (TOML path), TESSERA_GPUS, TESSERA_WORKER_ARGS
# (extra flags, word-split).
set -euo pipefail

config=${TESSERA_CONFIG:-/etc/tessera/tessera.toml}
gpus=${TESSERA_GPUS:-$(nvidia-smi --list-gpus 2>/dev/null | wc -l)}
read -r -a extra <<< "${TESSERA_WORKER_ARGS:-}"

if [ "$gpus" -lt 1 ]; then
  echo "worker-entrypoint: no GPU visible (set TESSERA_GPUS)" >&2
  exit 1
fi

pids=()
stop() {
  kill -TERM "${pids[@]}" 2>/dev/null || true
}
trap stop TERM INT

for ((i = 0; i < gpus; i++)); do
  tessera-worker --config "$config" --device "$i" "${extra[@]}" &
  pids+=("$!")
done

# The first worker to exit ends the pod; the others are stopped with it.
status=0
wait -n "${pids[@]}" || status=$?
stop
wait || true
exit "$status"
