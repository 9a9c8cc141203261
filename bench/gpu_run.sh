#!/usr/bin/env bash
# One call on a GPU host, in this order: the GPU tests (correctness first; meanwhile the
# benchmark's graphs compile, untimed, into the one compile cache every step shares, and the
# allocation probe runs), then the one job-vs-decode benchmark, then the worker's warm start
# (in a lean virtualenv of the worker's dependencies, then in this host's environment).
# Logs and JSON under $OUT (8 files); each step is cut to fit BUDGET seconds in all.
# Usage, from the repo root, the packages the host lacks installed in a folder on PYTHONPATH:
#   OUT=results-dir BUDGET=seconds bench/gpu_run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
BUDGET=${BUDGET:-1200}
# Seconds left, keeping $1 for the steps after this one (10 at least: timeout needs > 0).
left() { local n=$((BUDGET - SECONDS - $1)); echo $((n > 10 ? n : 10)); }
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
# Not "CC": the image exports CC (the C compiler Triton builds its launcher with), and a shell
# assignment to an exported name changes it for every child (seen: every compile failed).
FF_CACHE=/tmp/ff-compile-cache
export TORCHINDUCTOR_CACHE_DIR=$FF_CACHE/inductor TRITON_CACHE_DIR=$FF_CACHE/triton
JOBS=wan2.1:1280x720x81,wan2.2:1280x720x81,wan2.2:1280x704x121

{
  date -u; cat .commit 2>/dev/null; nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
    --format=csv,noheader
  python3 -c "import sys, torch, av, diffusers; print(sys.version, torch.__version__,
    av.__version__, diffusers.__version__)"
  env | grep -E '^(PYTHON|CC=)' || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The tests and the precompiles compile at once: fewer compile workers each than cores.
mkdir -p /tmp/pre
i=0
for job in ${JOBS//,/ }; do
  TORCHINDUCTOR_COMPILE_THREADS=4 timeout 240 python3 bench/decode/pipeline.py --precompile \
    --jobs "$job" --out "/tmp/pre/$i.json" > "/tmp/pre/$i.log" 2>&1 &
  i=$((i + 1))
done
(for case in old equal on-gpu; do timeout 120 python3 -m tests.gpu.alloc "$case"; done) \
  > "$OUT/alloc-probe.log" 2>&1 &

XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 6 --dist loadgroup"
echo "== GPU tests ($XDIST) at ${SECONDS}s"
# shellcheck disable=SC2086
TORCHINDUCTOR_COMPILE_THREADS=4 timeout "$(left 240)" python3 -m pytest -m gpu \
  --confcutdir=tests/gpu -p no:cacheprovider -v -rA --tb=short $XDIST tests/gpu \
  > "$OUT/gpu-tests.log" 2>&1
echo "tests rc=$?"; grep -E "(PASSED|FAILED|ERROR) " "$OUT/gpu-tests.log" | cut -c1-150; tail -2 "$OUT/gpu-tests.log"
wait
echo "== precompile done at ${SECONDS}s"; grep -h "warm-up" /tmp/pre/*.log | cut -c1-300
cut -c1-600 "$OUT/alloc-probe.log"

echo "== benchmark at ${SECONDS}s"
{ for f in /tmp/pre/*.log; do echo "-- $f"; tail -2 "$f"; done; } > "$OUT/bench.log"
timeout "$(left 95)" python3 bench/decode/pipeline.py --device cuda --reps 3 --jobs "$JOBS" \
  --modes decode_only,async,async_tail4 --weights-study --out "$OUT/pipeline.json" \
  >> "$OUT/bench.log" 2>&1
echo "bench rc=$?"

echo "== warm start at ${SECONDS}s"
W="--decoder wan2.2-vae --sizes 44x80 --cache $FF_CACHE"
# shellcheck disable=SC2086
timeout "$(left 32)" python3 bench/startup/warm_start.py $W --runs 3 --wait-first --lean /tmp/lean \
  --out "$OUT/warm-start-lean.json" > "$OUT/warm.log" 2>&1
# shellcheck disable=SC2086
timeout "$(left 3)" python3 bench/startup/warm_start.py $W --runs 1 --out "$OUT/warm-start-host.json" \
  >> "$OUT/warm.log" 2>&1
echo "== done at ${SECONDS}s"
grep -E "^\||passed|failed|error" "$OUT/bench.log" | tail -20
grep -vE '^\{' "$OUT/warm.log" | cut -c1-700 | tail -8
