"""Provoke the capture race on purpose (``tests/gpu/test_gpu_capture_race.py`` runs this in a
subprocess: a CUDA error would poison the test process's context).

The main thread runs generate jobs back to back (tiny pipeline, compiled, each job with its
device-wide synchronisations and an eager decode); a driver thread meanwhile asks a second
decoder for new sizes one after another, so their graphs compile and capture on background
threads while the jobs run. Each job's latents and segments must equal those of a job run with
nothing in the background. ``--no-gate`` replaces the process's gates with ones that let every
build and capture through at once (what the worker did before), to show the race is provoked.

  python -m tests.gpu.capture_race --reps 20 [--no-gate]   # prints one JSON line
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from producer.settings import get_settings
from producer.wire.spec import DecoderSpec
from tests.gpu.test_gpu_tiers import CUDA, Fleet
from worker import gate as gate_module
from worker.run import DecoderCache
from worker.watchdog import WATCHDOG

#: Latent sizes (h, w) the second decoder sees for the first time, back to back.
SIZES = [(8, 8), (8, 12), (12, 8), (12, 12), (8, 16), (16, 8)]


class NoGate(gate_module.CaptureGate):
    """What the worker did before the gate: captures never wait."""

    @contextmanager
    def capture(self) -> Iterator[None]:
        yield

    def yield_point(self) -> None:
        return


def run(reps: int, no_gate: bool, time_limit_s: float) -> dict[str, Any]:
    if no_gate:
        gate_module.GATE.__class__ = NoGate
        gate_module.TRACE.__class__ = NoGate
    out: dict[str, Any] = {"reps": 0, "broken": 0, "mismatches": 0, "no_gate": no_gate}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), ("exact",))
        # a decoder of its own that keeps a graph for every size (the fleet's builds none)
        second = DecoderCache(CUDA, graphs=len(SIZES)).get(
            DecoderSpec(name="wan2.1-vae", weights="random"))
        graphs = getattr(second, "graphs", None)
        assert graphs is not None, "the second decoder builds graphs on CUDA"
        ref, z_ref = fleet.job(num_inference_steps=12)
        ref_segments = [s.sha256 for s in ref.manifest.segments]

        def drive() -> None:
            for h, w in SIZES:
                key = second.graph_key(h, w)
                graphs.prepare_later(key)
                while graphs.get(key) is None and key not in graphs._failed:
                    time.sleep(0.05)  # the next size right after this one's steady graph

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
        graphs.wait(timeout=120)
        out["graphs_built"] = sum(graphs.get(second.graph_key(h, w)) is not None
                                  for h, w in SIZES)
        out["captures_failed"] = len(graphs._failed) + len(graphs._first_failed)
        out["captures_waited"] = gate_module.GATE.waits
        out["builds_waited"] = gate_module.TRACE.waits
        out["capture_wait_s"] = round(gate_module.GATE.waited_s, 3)
    torch.cuda.synchronize(CUDA)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--time-limit-s", type=float, default=240)
    args = ap.parse_args()
    # A run that hangs (two threads waiting for each other's lock) dumps every thread's stack
    # and ends after FRAMEFLEET_STUCK_S (the test sets it below its own timeout), instead of
    # being killed by the test without a word.
    WATCHDOG.arm("capture_race", get_settings().stuck_s, lambda stage, idle: None)
    try:
        result = run(args.reps, args.no_gate, args.time_limit_s)
    except Exception as e:  # noqa: BLE001 - a lost CUDA context ends here
        result = {"broken": 1, "error": f"{type(e).__name__}: {e}"[:500], "no_gate": args.no_gate}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
