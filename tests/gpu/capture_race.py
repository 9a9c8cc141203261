"""Background builds against jobs on the GPU (``tests/gpu/test_gpu_capture_race.py`` runs this
in a subprocess: a CUDA error would poison the test process's context).

The main thread runs generate jobs back to back (tiny pipeline, compiled, each job with its
device-wide synchronisations and an eager decode); a driver thread meanwhile asks a second
decoder for new sizes one after another, so their graphs are queued as builds of the process's
device owner (``worker.owner``) while the jobs run. The builds must run only between jobs, all
of them must be captured, and each job's latents and segments must equal those of a job run
with nothing in the background. (Before the owner, builds overlapped jobs: captures broke, and
two gates taken in opposite orders deadlocked.)

  python -m tests.gpu.capture_race --reps 20   # prints one JSON line
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from producer.settings import get_settings
from producer.wire.spec import DecoderSpec
from tests.gpu.test_gpu_tiers import CUDA, Fleet
from worker.owner import DEVICE
from worker.run import DecoderCache
from worker.watchdog import WATCHDOG

#: Latent sizes (h, w) the second decoder sees for the first time, back to back.
SIZES = [(8, 8), (8, 12), (12, 8), (12, 12), (8, 16), (16, 8)]


def run(reps: int, time_limit_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"reps": 0, "broken": 0, "mismatches": 0}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), ("exact",))
        # a decoder of its own that keeps a graph for every size (the fleet's builds none)
        second = DecoderCache(CUDA, graphs=len(SIZES)).get(
            DecoderSpec(name="wan2.1-vae", weights="random"))
        graphs = getattr(second, "graphs", None)
        assert graphs is not None, "the second decoder builds graphs on CUDA"
        ref, z_ref = fleet.job(num_inference_steps=12)
        ref_segments = [s.sha256 for s in ref.manifest.segments]

        def drive() -> None:  # only queues: the builds run on the owner's builder
            for h, w in SIZES:
                graphs.prepare_later(second.graph_key(h, w))
                time.sleep(0.3)

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        deadline = time.monotonic() + time_limit_s
        try:
            while (out["reps"] < reps or driver.is_alive()) and time.monotonic() < deadline:
                result, z = fleet.job(num_inference_steps=12)
                out["reps"] += 1
                same = torch.equal(z, z_ref) and [s.sha256 for s in result.manifest.segments] \
                    == ref_segments
                out["mismatches"] += not same
        except Exception as e:  # noqa: BLE001 - the race's symptom, reported
            out["broken"] += 1
            out["error"] = f"{type(e).__name__}: {e}"[:500]
            out["trace"] = traceback.format_exc()[-1500:]
        out["drained"] = graphs.wait(timeout=300)
        out["graphs_built"] = sum(graphs.get(second.graph_key(h, w)) is not None
                                  for h, w in SIZES)
        out["first_graphs_built"] = sum(
            getattr(graphs.get(second.graph_key(h, w)), "first", None) is not None
            for h, w in SIZES)
        out["captures_failed"] = len(graphs._failed) + len(graphs._first_failed)
        out["builds_done"] = DEVICE.stats.builds_done
        out["builds_failed"] = DEVICE.stats.builds_failed
        out["jobs_waited_for_a_build"] = DEVICE.stats.job_waits
        out["job_wait_s"] = round(DEVICE.stats.job_waited_s, 3)
    torch.cuda.synchronize(CUDA)
    out["closed"] = DEVICE.close(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--time-limit-s", type=float, default=240)
    args = ap.parse_args()
    # A run that hangs (two threads waiting for each other's lock) dumps every thread's stack
    # and ends after FRAMEFLEET_STUCK_S (the test sets it below its own timeout), instead of
    # being killed by the test without a word.
    WATCHDOG.arm("capture_race", get_settings().stuck_s, lambda stage, idle: None)
    try:
        result = run(args.reps, args.time_limit_s)
    except Exception as e:  # noqa: BLE001 - a lost CUDA context ends here
        result = {"broken": 1, "error": f"{type(e).__name__}: {e}"[:500]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
