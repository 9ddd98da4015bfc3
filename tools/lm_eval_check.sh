#!/usr/bin/env bash
# lm-eval's local-completions model against a real Tessera deployment, checked against
# transformers (issue #37, section 5).
#
# 1. Makes its own venv (~/.cache/tessera/lm-eval-venv, not the tests' venv) with pinned
#    lm-eval, transformers and torch from PyPI (torch's wheel is large; CI never runs this).
# 2. Starts build/tessera-coordinator and one build/tessera-worker on CPU (tp 1, pp 1,
#    float32, CURVE keys made with `tessera keygen`, ports picked by the kernel) on
#    SmolLM2-135M-Instruct ($TESSERA_SMOLLM2_DIR, else models/default).
# 3. Runs `lm_eval --model local-completions` on tools/lm_eval_task (a 20-question local
#    multiple-choice task) with --log_samples, through a recording proxy
#    (tools/lm_eval_check.py proxy) that keeps every request and response body.
# 4. Recomputes each request's log-likelihood with transformers in float32
#    (tools/lm_eval_check.py compare) and fails when the largest difference exceeds 1e-4.
# 5. Writes bench/results/lm_eval_<UTC date>.md (commands, versions, numbers).
#
# Usage: bash tools/lm_eval_check.sh [--out FILE] [--batch-size N]
# (TESSERA_BIN_DIR: where the three binaries are, default build/; TESSERA_LM_EVAL_KEEP=1 keeps
# the run folder with the daemons' logs, lm-eval's samples and the proxy's requests.jsonl)
# Exit: 0 when every per-example difference is within 1e-4, 1 otherwise, 2 on set-up errors.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${TESSERA_LM_EVAL_VENV:-$HOME/.cache/tessera/lm-eval-venv}
pins=("lm-eval[api]==0.4.13" "transformers==5.24.0" "torch==2.15.0")
out="bench/results/lm_eval_$(date -u +%Y-%m-%d).md"
batch_size=4
tolerance=1e-4
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --batch-size) batch_size=$2; shift 2 ;;
    *) echo "lm_eval_check: unknown argument '$1' (--out FILE, --batch-size N)" >&2; exit 2 ;;
  esac
done

model=${TESSERA_SMOLLM2_DIR:-}
if [ -z "$model" ]; then model=$root/models/default; fi
model=$(cd "$model" 2>/dev/null && pwd -P) || {
  echo "lm_eval_check: no model folder (set TESSERA_SMOLLM2_DIR or run scripts/setup)" >&2
  exit 2
}
bin=${TESSERA_BIN_DIR:-build}
for b in tessera tessera-coordinator tessera-worker; do
  [ -x "$bin/$b" ] || { echo "lm_eval_check: $bin/$b missing (run scripts/setup)" >&2; exit 2; }
done

# ---- 1. the venv ----
stamp="$venv/.tessera-pins"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${pins[*]}" ]; then
  echo "lm_eval_check: installing ${pins[*]} into $venv (torch is several GB)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --no-cache-dir -q "${pins[@]}"
  echo "${pins[*]}" >"$stamp"
fi
py="$venv/bin/python"

# ---- 2. the daemons ----
run=$(mktemp -d "${TMPDIR:-/tmp}/tessera-lm-eval-XXXXXX")
pids=()
# shellcheck disable=SC2317  # called through the EXIT trap
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[$i]}" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ -n "${TESSERA_LM_EVAL_KEEP:-}" ]; then
    echo "lm_eval_check: kept $run (logs, lm-eval samples, requests.jsonl)"
  else
    rm -rf "$run"
  fi
}
trap cleanup EXIT
wait_file() { # FILE PID WHAT
  for _ in $(seq 1 1200); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "lm_eval_check: $3 exited; its log:" >&2; cat "$4" >&2; exit 2; }
    sleep 0.1
  done
  echo "lm_eval_check: no $1 from $3 after 120 s" >&2
  exit 2
}

"$bin/tessera" keygen --out "$run/coordinator" >/dev/null
"$bin/tessera" keygen --out "$run/worker0" >/dev/null
coordinator_args=(--config configs/local-cpu.toml --set "model.path=$model"
  --set model.dtype=float32 --set parallel.tp=1 --set parallel.pp=1
  --set server.port=0 --set admin.port=0 --set server.control_endpoint=tcp://127.0.0.1:0
  --set control.coordinator_secret_key_file="$run/coordinator.key"
  --set "control.worker_public_keys=[\"$(tail -n 1 "$run/worker0.pub")\"]")
"$bin/tessera-coordinator" "${coordinator_args[@]}" --ports-file "$run/ports.json" \
  >"$run/coordinator.log" 2>&1 &
pids+=($!)
wait_file "$run/ports.json" "${pids[0]}" coordinator "$run/coordinator.log"
port() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$run/ports.json" "$1"; }
api=$(port api)
control=$(port control)
worker_args=(--coordinator "tcp://127.0.0.1:$control" --device 0
  --set "control.worker_secret_key_file=$run/worker0.key"
  --set "control.coordinator_public_key=$(tail -n 1 "$run/coordinator.pub")")
"$bin/tessera-worker" "${worker_args[@]}" >"$run/worker0.log" 2>&1 &
pids+=($!)
ready=0
for _ in $(seq 1 1200); do
  if curl -sf "http://127.0.0.1:$api/readyz" >/dev/null; then ready=1; break; fi
  kill -0 "${pids[1]}" 2>/dev/null || break
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "lm_eval_check: the deployment did not become ready; logs:" >&2
  tail -n 30 "$run/coordinator.log" "$run/worker0.log" >&2
  exit 2
fi
served=$(curl -sf "http://127.0.0.1:$api/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')

# ---- 3. lm-eval through the recording proxy ----
"$py" tools/lm_eval_check.py proxy --upstream "http://127.0.0.1:$api" \
  --port-file "$run/proxy.port" --log "$run/requests.jsonl" &
pids+=($!)
wait_file "$run/proxy.port" "${pids[2]}" proxy /dev/null
proxy=$(cat "$run/proxy.port")
lm_eval_cmd=("$venv/bin/lm_eval" --model local-completions
  --model_args "model=$served,base_url=http://127.0.0.1:$proxy/v1/completions,tokenizer_backend=huggingface,tokenizer=$model,num_concurrent=1,max_retries=1,max_length=2048"
  --tasks tessera_loglik --include_path tools/lm_eval_task --batch_size "$batch_size"
  --log_samples --output_path "$run/lm_eval")
echo "lm_eval_check: ${lm_eval_cmd[*]}"
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "${lm_eval_cmd[@]}" \
  2>&1 | tee "$run/lm_eval.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "lm_eval_check: lm_eval failed" >&2; exit 1; }

# ---- 4 and 5. compare and record ----
mkdir -p "$(dirname "$out")"
versions=$("$py" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("lm_eval", "transformers", "torch", "datasets")))')
{
  echo "# lm-eval local-completions vs transformers ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo
  echo "Written by \`bash tools/lm_eval_check.sh\` (tools/README.md). Tessera commit"
  echo "\`$(git rev-parse --short HEAD)\`$(git diff --quiet HEAD -- . ':!bench/results' || echo ' (with uncommitted changes)'); $(uname -m), $(nproc) cores."
  echo
  echo "- Python packages (venv ${venv/#$HOME/\~}): $versions"
  echo "- Model: SmolLM2-135M-Instruct, \`${model/#$HOME/\~}\` (served as \`$served\`), float32, CPU"
  echo "- Deployment: $bin/tessera-coordinator + one $bin/tessera-worker (tp 1, pp 1, CURVE keys)"
  echo
  echo "Commands as run (RUN: the run's temporary folder, VENV: the venv, <X.pub>: the public key in RUN/X.pub):"
  echo
  echo '```sh'
  shown="$bin/tessera keygen --out RUN/coordinator; $bin/tessera keygen --out RUN/worker0
$bin/tessera-coordinator ${coordinator_args[*]} --ports-file RUN/ports.json
$bin/tessera-worker ${worker_args[*]}
${lm_eval_cmd[*]}"
  # Literal replacements (Z85 keys hold characters that sed would read as regex).
  shown=${shown//"$run"/RUN}
  shown=${shown//"$venv"/VENV}
  shown=${shown//"$(tail -n 1 "$run/worker0.pub")"/<worker0.pub>}
  shown=${shown//"$(tail -n 1 "$run/coordinator.pub")"/<coordinator.pub>}
  echo "${shown//"$HOME"/\~}"
  echo '```'
  echo
  echo "lm-eval's base_url is the recording proxy (tools/lm_eval_check.py proxy) in front of the API"
  echo "port; the proxy forwards each body unchanged."
  echo
  echo "lm-eval's summary:"
  echo
  echo '```'
  grep -E '^\|' "$run/lm_eval.log" || true
  echo '```'
  echo
} >"$out.tmp"
status=0
"$py" tools/lm_eval_check.py compare --samples-dir "$run/lm_eval" --model "$model" \
  --requests-log "$run/requests.jsonl" --tolerance "$tolerance" --out "$out.tmp" || status=$?
mv "$out.tmp" "$out"
echo "lm_eval_check: wrote $out"
exit "$status"
