"""One worker start, in a fresh process: the pool process's own start to ready, then two jobs.

``bench/startup/start_rows.py`` runs this as a script, once per start row, with the row's
compile cache in the environment (``FRAMEFLEET_COMPILE_CACHE_DIR``); the model folder's
``compiled/`` holds the artifact where the row has one. What the worker's pool process does
from its start hook (``worker.lifecycle.main``), without Celery or a broker: the weight files'
readahead first thing (before torch is imported, as the worker's entry point starts it), the
decoder cache, the warm-up with the folder as ``FRAMEFLEET_WARMUP_MODEL`` (load method fast),
ready; then a first job and a second one like it, each to its end, each writing to a folder of
its own. One JSON line on stdout: the phases and the critical path, ready, what each size and
decoder graph of the warm-up found in the caches (hit or miss and why), both jobs' seconds and
stages.

``--tiny``: the CPU, the layout in miniature; its transformer compiles with inductor's C++
backend (``FRAMEFLEET_COMPILE_ON_CPU``), so the hit and miss lines mean what they mean on a GPU
(the decoder's graphs are CUDA graphs: none on the CPU).

    python bench/startup/start_child.py --folder F --device cuda --started $(date +%s.%N)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The job size of each mode (the 5B's warm-up size; the tiny layout's).
SIZES = {"tiny": "64x64x9", "cuda": "704x1280x121"}


def child(folder: str, device: str, started: float, tiny: bool, threads: int) -> dict[str, Any]:
    """The start to ready, then two jobs, timed (``threads``: ``FRAMEFLEET_LOAD_THREADS``)."""
    from worker.lifecycle import readahead  # first: no torch in it

    ahead = readahead.begin(folder, threads)
    import logging
    import tempfile

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(relativeCreated)d ms %(levelname)s %(name)s: %(message)s")
    import torch  # noqa: F401  (counted as imports)

    from producer.settings import Settings
    from worker.lifecycle import startphases, warmup
    from worker.run import default_decoders

    hook = time.time()
    size = SIZES["tiny" if tiny else "cuda"]
    # The rest from the environment: the row's compile cache folder, as a worker's
    settings = Settings(device=device, warmup_model=folder, load_method="fast",
                        load_threads=threads, warmup_generate_sizes=size, compile_on_cpu=tiny,
                        work_dir=tempfile.mkdtemp(), file_roots=str(Path(folder).parent))
    decoders = default_decoders(settings)
    state = warmup.warm_up(decoders, settings, started=started, readahead=ahead,
                           phases={"imports": hook - started, "init": time.time() - hook})
    out: dict[str, Any] = {
        "mode": "framefleet", "load_threads": threads, "phases": state.phases,
        "critical": state.critical, "ready_s": time.time() - started,
        "ready_line": startphases.ready_line(state.phases, state.critical),
        "compiled": startphases.compiled(state.model),
        "weights_to_device_s": state.phases["read"] + state.phases["cast_move"],
        "disk_to_device_s": _disk_to_device(state.model, ahead),
        "warmup": {tier: {k: v for k, v in info.items() if k != "spans"}
                   for tier, info in state.model.items() if isinstance(info, dict)}}
    for n, name in enumerate(("first", "second")):
        out.update({f"{name}_{k}": v for k, v in _job(name, folder, size, tiny, settings,
                                                     decoders).items()})
        if n == 0:
            out["first_job_end_s"] = time.time() - started
    return out


def _disk_to_device(model: dict[str, Any], ahead: Any) -> float | None:
    """From the first byte asked of the disk (the readahead's start, or the load's) to the
    last weight on the device: what the raw parallel read of the same files compares with."""
    from worker.lifecycle.startphases import model_spans

    reads = [(a, b) for p, a, b in model_spans(model) if p == "read"]
    if not reads:
        return None
    first = min(a for a, _ in reads)
    if ahead is not None:
        first = min(first, ahead.start)
    return max(b for _, b in reads) - first


def _job(name: str, folder: str, size: str, tiny: bool, settings: Any,
         decoders: Any) -> dict[str, Any]:
    """One generate job at ``size`` to its end, in a folder of its own beside the model (no
    run finds another's output and returns it unchanged: ``reused``, in 2 ms, on the H200)."""
    import tempfile

    from producer.wire.spec import GenerateSpec, JobSpec, OutputSpec, VideoSpec
    from worker.run import Run, run_job

    h, w, f = (int(v) for v in size.split("x"))
    outputs = Path(tempfile.mkdtemp(prefix="outputs-", dir=Path(folder).parent))
    spec = JobSpec(job_id=name, output=OutputSpec(uri=outputs.as_uri()),
                   video=VideoSpec(segment_frames=4 if tiny else 16), generate=GenerateSpec(
                       model=Path(folder).as_uri(), prompt="a red fox in the snow", height=h,
                       width=w, num_frames=f, num_inference_steps=2, guidance_scale=1.0))
    t = time.perf_counter()
    result = run_job(spec, decoders, Run(spec, settings=settings))
    seconds = time.perf_counter() - t
    if result.reused:  # not a job that ran: nothing was generated
        raise SystemExit(f"the {name} job reused an earlier output: {result.manifest_uri}")
    return {"job_s": seconds, "job_segments": len(result.manifest.segments),
            "job_stages": {k: round(v, 3) for k, v in result.timings.model_dump().items()
                           if isinstance(v, float) and v > 0}}


def exit_child(out: dict[str, Any]) -> None:
    """The child's end, clean: what the worker's start left running is stopped, as a pool
    process stops it (``worker.lifecycle.shutdown``: compile workers, monitors), and the
    threads still running are reported (``threads_left``). One may be a decode graph still
    building in the background (CUDA): it is abandoned, since the process is done and joining
    it would cost its whole compile, and an interpreter torn down under a live compile or
    CUDA thread aborts (``terminate called without an active exception``); so the child then
    ends at once with status 0, its output flushed."""
    from worker.lifecycle.shutdown import stop_process

    out["threads_left"] = left = stop_process()
    print(json.dumps(out), flush=True)
    if left:
        sys.stderr.flush()
        os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--folder", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--started", type=float, required=True, help="the process start, epoch s")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    exit_child(child(args.folder, args.device, args.started, args.tiny, args.threads))


if __name__ == "__main__":
    main()
