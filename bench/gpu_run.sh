#!/usr/bin/env bash
# One device call: install the carried wheels, run the GPU tests, then the pipeline benchmark.
# Usage (on a CUDA host, from the repo root, wheels in .whl/): OUT=results-dir bench/gpu_run.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, av, diffusers; print('torch', torch.__version__, 'av', av.__version__, 'diffusers', diffusers.__version__)"
command -v ffmpeg || echo "no ffmpeg executable"
python3 -m pytest -m gpu --confcutdir=tests/gpu -p no:cacheprovider -q -s tests/gpu 2>&1 \
  | tee "$OUT/gpu-tests.log"
python3 bench/pipeline.py --device cuda --sizes 1280x720,832x480 --frames 81 --reps 5 \
  --scale4 --out "$OUT/pipeline.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
