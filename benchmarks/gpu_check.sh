#!/usr/bin/env bash
# The GPU check: the gpu-marked tests, then creditflow's rollout backends (hf, lean, and vllm
# colocate when installed) against TRL on a random model of Qwen2.5-0.5B's configuration in
# bfloat16, plus one FSDP2 step (benchmarks/gpu_check.py); then, when the real
# SmolLM2-135M-Instruct has been fetched (`creditflow fetch-model smollm2-135m-instruct`),
# creditflow on policy and with max_staleness 1 against TRL on it (benchmarks/compare.py,
# alternating, median of 3). At most 12 minutes on one GPU: every stage runs under `timeout`.
#
#   benchmarks/gpu_check.sh [--cpu] [OUT_DIR [gpu_check.py options...]]
#
# --cpu: the dry run (tiny model, float32, CPU, seconds; the tests skip it: they need a GPU).
# OUT_DIR (default: a new temporary folder) receives the model, records.jsonl and the table.
# PYTHON overrides the interpreter (default: the project's .venv).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
cpu=""
if [[ "${1:-}" == "--cpu" ]]; then
    cpu="--cpu"
    shift
fi
out=${1:-$(mktemp -d -t creditflow-gpu-check-XXXXXX)}
shift || true
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 KEDRO_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
started=$(date +%s)

status=0
if [[ -z "$cpu" ]]; then
    echo "== gpu-marked tests (at most 3 minutes)"
    timeout 180 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider tests || status=$?
else
    echo "== gpu-marked tests: skipped in the --cpu dry run"
fi

echo "== measurements (at most 5 minutes)"
timeout 300 "$PYTHON" benchmarks/gpu_check.py $cpu --out "$out" "$@" | tee "$out/table.md" || status=$?
smollm2=data/06_models/pretrained/smollm2-135m-instruct
if [[ -z "$cpu" && -f "$smollm2/config.json" ]]; then
    echo "== SmolLM2-135M-Instruct: creditflow and TRL, bfloat16 (at most 4 minutes)"
    timeout 240 "$PYTHON" benchmarks/compare.py --model-dir "$smollm2" --repeat 3 \
        --out "$out/smollm2_records.jsonl" \
        --labels creditflow "creditflow[max_staleness=1]" trl -- \
        --prompts-file "$out/model/prompts.jsonl" --device cuda --bf16 --threads 2 \
        --prompts 4 --group-size 8 --max-new-tokens 64 --steps 2 --profile \
        | tee "$out/smollm2_table.md" || status=$?
else
    echo "== SmolLM2-135M-Instruct: skipped (--cpu, or not fetched: creditflow fetch-model smollm2-135m-instruct)"
fi

echo "== done in $(( $(date +%s) - started )) s, exit status $status; records in $out"
exit $status
