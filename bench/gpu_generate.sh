#!/usr/bin/env bash
# One device call for the generate tiers (issues 23 and 24): correctness first, then timings,
# inside BUDGET seconds (default 540), skipping the least important rows when time runs out.
#   1. bench/generate/generate.py: Wan2.2-TI2V-5B 1280x704x121 at 20 and 4 steps, tiers exact, cache,
#      fp8, against diffusers' WanPipeline + export (denoise-h200.json); then an image-to-video
#      job on the 5B against WanImageToVideoPipeline (latents identical), a LoRA switch on the
#      5B, and Wan2.1-1.3B 832x480x81 rows; peak GPU memory per row
#   2. bench/startup/warm_generate.py: a worker start with the compile cache the run above left
#   3. pytest -m gpu on the tier and image-to-video tests, with what time is left
# Usage (on a CUDA host, from the repo root, wheels in .whl/): OUT=dir BUDGET=540 \
#   bench/gpu_generate.sh
# DRY_RUN=1 (any host, no wheels installed, PY=python of a venv): the same steps at tiny sizes
# on the CPU: generate.py --tiny (fp8 rows skipped with the reason), a tiny warm start.
set -uo pipefail
T0=$(date +%s)
BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
OUT=${OUT:?OUT must name the results folder}
DRY=${DRY_RUN:-0}
PY=${PY:-python3}
if [ "$DRY" = 1 ]; then
  SIZE=(--tiny --image tiny-ti2v --lora tiny-ti2v) WARM=(--model tiny-ti2v --size 64x64x9)
  : >"$OUT/install.log"
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
else
  SIZE=(--models wan2.2-ti2v-5b,wan2.1-t2v-1.3b --image wan2.2-ti2v-5b --lora wan2.2-ti2v-5b)
  WARM=(--model wan2.2-ti2v-5b --size 704x1280x121)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
fi
export FRAMEFLEET_COMPILE_CACHE_DIR=/tmp/ff-compile-cache
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, diffusers, torchao, peft, PIL; print('torch', torch.__version__, \
'diffusers', diffusers.__version__, 'torchao', torchao.__version__, 'peft', peft.__version__, \
'pillow', PIL.__version__, 'cuda', torch.cuda.is_available())"
  echo "install and checks done at $(( $(date +%s) - T0 )) s"
} 2>&1 | tee -a "$OUT/install.log"

# 1. the tiers, image-to-video, LoRA switch, 1.3B (generate.py skips what does not fit)
RESERVE=$(( $(left) > 300 ? 110 : 20 ))  # room for the warm start and a few GPU tests
timeout $(( $(left) - 10 )) $PY bench/generate/generate.py "${SIZE[@]}" --steps 20,4 \
  --tiers exact,cache,fp8 --image-steps 4 --decode-graphs 1 \
  --budget-s $(( $(left) - RESERVE )) --json denoise-h200.json --out "$OUT" \
  >"$OUT/generate.log" 2>&1
echo "generate.py exit $? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/generate.log"

# 2. worker start, warm cache (the 5B compiled by the run above), exact and fp8
if [ "$(left)" -gt 90 ]; then
  TIERS=exact,fp8
  grep -q '"tier": "fp8"' "$OUT/denoise-h200.json" 2>/dev/null || TIERS=exact
  timeout $(( $(left) - 15 )) $PY bench/startup/warm_generate.py "${WARM[@]}" --tiers $TIERS --out "$OUT/warm-start-generate-h200.json" \
    >"$OUT/warm-start.log" 2>&1
  echo "warm_generate.py exit $? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/warm-start.log"
else
  echo "skipped: worker start (no time left)" | tee "$OUT/warm-start.log"
fi

# 3. the GPU tests of the tiers and image-to-video
if [ "$(left)" -gt 45 ]; then
  timeout $(( $(left) - 5 )) $PY -m pytest -m gpu --confcutdir=tests/gpu -p no:cacheprovider \
    -q -s tests/gpu/test_gpu_tiers.py tests/gpu/test_gpu_i2v.py >"$OUT/gpu-tests-generate.log" 2>&1
  echo "pytest exit $? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/gpu-tests-generate.log"
else
  echo "skipped: GPU tests (no time left)" | tee "$OUT/gpu-tests-generate.log"
fi

# the short table
sed -n '/^| model/,$p' "$OUT/generate.log" | head -40
grep -h '"process_start_to_ready_s"\|ready_s\|_first_step_s\|_prepare_s' \
  "$OUT/warm-start-generate-h200.json" 2>/dev/null | head -12
tail -3 "$OUT/gpu-tests-generate.log"
echo "total $(( $(date +%s) - T0 )) s of $BUDGET"
