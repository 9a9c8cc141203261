#!/usr/bin/env bash
# The device work of the GPU-trust issue, rerunnable from scratch, one stage per device call
# (a call may run 10 minutes), in this order: correctness first, then the soak, then the rows.
# tests, soak and bench each fit one call of BUDGET=560 s on a fresh machine, with nothing
# from an earlier stage (the wheels' install included, ~20 s):
#   STAGE=tests  pytest -m gpu: the whole GPU suite (~480 s on the H200), nothing else
#   STAGE=soak   bench/soak/soak.py: the real worker process, a real Redis, >= 40 mixed jobs
#                (soak-h200.json / .md). SOAK_WARM=all (default): the worker starts, with an
#                empty compile cache, from the compile artifacts STAGE=prime wrote to ARTIFACTS
#                (run it first on the same machine, or carry the folder), compiled denoise and
#                decode graphs as in production; none: it compiles no size and its denoise runs
#                eager, ready in well under a minute with nothing primed. The
#                soak submits until its --budget-s less the drain (50 s): at BUDGET=560 that
#                is ~7.5 min of soak after a ~20 s install and a ~45 s start; BUDGET=590 gives
#                >= 8 min
#   STAGE=bench  bench/generate/generate.py: the 5B at 20 and 4 steps, tiers exact, cache, fp8,
#                fp8+cache, against diffusers (denoise-h200-5b.json + .md: command, date, device)
# and, when there is device time for them:
#   STAGE=fp8    the 5B at 20 steps, tiers fp8 and fp8+cache alone (denoise-h200-5b-fp8.json):
#                a cold fp8 compile takes ~230 s, more than a full bench call leaves it, and
#                with exact as well one call ran out (the exact rows are STAGE=bench's);
#                quality against diffusers' latents, no exact reference in this call
#   STAGE=extra  the 1.3B denoise rows
#   STAGE=prime  bench/soak/soak_prime.py: every soak and bench size compiled into the compile cache
#                (cold: minutes a size), a process a task in parallel, each task's compile
#                artifact (decoder graphs included) written under ARTIFACTS, so that a soak with
#                SOAK_WARM=all and the bench rows start in seconds
#   STAGE=race   the capture-race test alone (builds against jobs, worker/owner.py)
# Every script and option here also runs in CI at tiny size on the CPU (tests/bench/).
# Usage, on a CUDA host from the repository root, wheels in .whl/ and Debian's redis-server
# with its libraries in .redis/ (bench/README.md says how to make both):
#   OUT=dir STAGE=tests BUDGET=560 bench/gpu_trust.sh
set -uo pipefail
T0=$(date +%s)
BUDGET=${BUDGET:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
OUT=${OUT:?OUT must name the results folder}
STAGE=${STAGE:?STAGE is tests, soak, bench, fp8, extra, prime or race}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >"$OUT/install-$STAGE.log" 2>&1 || { cat "$OUT/install-$STAGE.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
# One compile cache for every stage of one machine: later stages load what earlier compiled.
export FRAMEFLEET_COMPILE_CACHE_DIR=/tmp/ff-compile-cache
ARTIFACTS=${ARTIFACTS:-/tmp/ff-artifacts}  # STAGE=prime writes them, STAGE=soak starts from them
export TORCHINDUCTOR_CACHE_DIR=$FRAMEFLEET_COMPILE_CACHE_DIR/inductor
export TRITON_CACHE_DIR=$FRAMEFLEET_COMPILE_CACHE_DIR/triton
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, diffusers, torchao, av, celery; print('torch', torch.__version__,
'diffusers', diffusers.__version__, 'torchao', torchao.__version__, 'av', av.__version__,
'celery', celery.__version__)"
  # torchao picks its fused rowwise kernels (mslk) only where that package is installed, and
  # its quantize kernel only without an activation floor: the fp8 rows depend on which ran
  python3 -c "import importlib.util as u; print('mslk installed:', u.find_spec('mslk') is not None)"
} 2>&1 | tee "$OUT/env-$STAGE.txt"

case "$STAGE" in
tests)
  XDIST=""
  python3 -c "import xdist" 2>/dev/null && XDIST="-n 4 --dist loadgroup"
  # shellcheck disable=SC2086
  timeout $(( $(left) - 10 )) python3 -m pytest -m gpu --confcutdir=tests/gpu \
    -p no:cacheprovider -v -rA --tb=short $XDIST tests/gpu >"$OUT/gpu-tests.log" 2>&1
  echo "pytest exit $? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/gpu-tests.log"
  grep -E "(PASSED|FAILED|ERROR) " "$OUT/gpu-tests.log" | cut -c1-160
  ;;
fp8)
  timeout $(( $(left) - 5 )) python3 bench/generate/generate.py --models wan2.2-ti2v-5b --steps 20 \
    --tiers fp8,fp8+cache --decode-graphs 1 --budget-s $(( $(left) - 20 )) \
    --json denoise-h200-5b-fp8.json --out "$OUT" >"$OUT/generate-5b-fp8.log" 2>&1
  echo "generate.py exit $?"; sed -n '/^| model/,$p' "$OUT/generate-5b-fp8.log"
  ;;
extra)
  timeout $(( $(left) - 5 )) python3 bench/generate/generate.py --models wan2.1-t2v-1.3b --steps 20 \
    --tiers exact,cache --decode-graphs 1 --budget-s $(( $(left) - 15 )) \
    --json denoise-h200-1.3b.json --out "$OUT" >"$OUT/generate-1.3b.log" 2>&1
  echo "generate.py exit $?"; sed -n '/^| model/,$p' "$OUT/generate-1.3b.log"
  ;;
race)  # the capture race alone: builds queued while jobs run (worker/owner.py)
  timeout $(( $(left) - 10 )) python3 -m pytest -m gpu --confcutdir=tests/gpu -p no:cacheprovider \
    -v -rA -s --tb=short tests/gpu/test_gpu_capture_race.py >"$OUT/gpu-tests-race.log" 2>&1
  echo "pytest exit $?"; grep -E "PASSED|FAILED|broken|passed|failed" "$OUT/gpu-tests-race.log" | cut -c1-400
  ;;
prime)  # every soak and bench size compiled into the compile cache, one process a task, in parallel
  timeout $(( $(left) - 5 )) python3 bench/soak/soak_prime.py --soak --bench --out "$OUT" \
    --artifacts "$ARTIFACTS" >"$OUT/soak-prime.log" 2>&1
  echo "prime exit $?"; cat "$OUT/soak-prime.log"
  ;;
soak)
  LD_LIBRARY_PATH=$PWD/.redis/lib .redis/redis-server --version
  # new jobs until 8 minutes and 40 jobs, or until the budget less the drain (the soak's
  # minutes run from its first submit to its last end)
  timeout $(( $(left) - 3 )) python3 bench/soak/soak.py --minutes 8 --max-minutes 9 --jobs 40 \
    --warm-sizes "${SOAK_WARM:-all}" --budget-s $(( $(left) - 8 )) \
    $( [ "${SOAK_WARM:-all}" = all ] && echo --artifacts "$ARTIFACTS" ) \
    --redis-server "$PWD/.redis/redis-server" --redis-lib "$PWD/.redis/lib" \
    --out "$OUT" >"$OUT/soak.log" 2>&1
  echo "soak exit $?"; tail -40 "$OUT/soak.log"
  ;;
bench)
  # every tier at 20 steps first (fp8+cache included), then the 4-step rows: on a cold compile
  # cache the fp8 compile takes minutes, and a short budget drops the 4-step rows, measured before
  timeout $(( $(left) - 5 )) python3 bench/generate/generate.py --models wan2.2-ti2v-5b --steps 20,4 \
    --order steps --tiers exact,cache,fp8,fp8+cache --decode-graphs 1 --budget-s $(( $(left) - 20 )) \
    --json denoise-h200-5b.json --out "$OUT" >"$OUT/generate-5b.log" 2>&1
  echo "generate.py exit $?"; sed -n '/^| model/,$p' "$OUT/generate-5b.log"
  ;;
esac
echo "stage $STAGE done in $(( $(date +%s) - T0 )) s of $BUDGET"
