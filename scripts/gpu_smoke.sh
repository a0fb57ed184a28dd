#!/usr/bin/env bash
# One GPU smoke run, under 8 minutes on one GPU; prints one table and writes it to results/gpu_smoke/gpu_smoke.md
# (commit that table to docs/results/gpu.md with the GPU's name). See scripts/gpu_smoke.py for the checks.
#   scripts/gpu_smoke.sh                      # cuda (the current GPU)
#   scripts/gpu_smoke.sh --device cuda:1
#   scripts/gpu_smoke.sh --device cpu --quick --cpu-ddp --out /tmp/smoke    # the dry run on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
exec "$PY" scripts/gpu_smoke.py "$@"
