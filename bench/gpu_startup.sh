#!/usr/bin/env bash
# The scale-up rows of a new GPU host, rerunnable from scratch in one device call (10 minutes)
# on a fresh machine: bench/startup/worker_start.py writes the published 5B layout at real size
# (random weights, 34 GB), then in one run the raw parallel read after drop_caches, diffusers'
# load (page cache warm and dropped), the worker's start with no artifact and an empty compile
# cache, framefleet compile, and the start from the artifact with an empty compile cache (page
# cache warm, then dropped), each start with a first and a second job
# (worker-start-<gpu>.json / .md: command, date, device, the targets checked).
# Every option it runs also runs in CI at tiny size on the CPU (tests/bench/test_worker_start_tiny.py).
# Usage, on a CUDA host from the repository root, wheels in WHEELS (default .whl/; bench/README.md
# says which):
#   OUT=dir BUDGET=560 bench/gpu_startup.sh
set -uo pipefail
T0=$(date +%s)
BUDGET=${BUDGET:-560}
OUT=${OUT:?OUT must name the results folder}
WHEELS=${WHEELS:-.whl}
FOLDER=${FOLDER:-/tmp/ff-start/wan22-ti2v-5b}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$WHEELS"/*.whl >"$OUT/install-startup.log" 2>&1 \
  || { cat "$OUT/install-startup.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, diffusers, transformers, safetensors; print('torch', torch.__version__,
'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'safetensors',
safetensors.__version__)"
  nproc; free -g | head -2; df -h "$(dirname "$(dirname "$FOLDER")")" | tail -1
} 2>&1 | tee "$OUT/env-startup.txt"
rm -rf "$FOLDER"
timeout $(( BUDGET - ($(date +%s) - T0) - 5 )) python3 bench/startup/worker_start.py \
  --folder "$FOLDER" --methods none --threads-list 16 --out "$OUT" >"$OUT/worker-start.log" 2>&1
echo "worker_start exit $? at $(( $(date +%s) - T0 )) s"
grep -v "^ " "$OUT/worker-start.log" | grep -E "^\||^- |^Raw|^framefleet compile|rror" | cut -c1-700
rm -rf "$FOLDER"
echo "startup done in $(( $(date +%s) - T0 )) s of $BUDGET"
