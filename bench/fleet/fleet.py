"""A fleet run on one host: the launcher, real Celery workers, N jobs, every output verified.

Uses the embedded broker (``filesystem://`` + sqlite) so it needs no Redis, which makes it
runnable on a bare GPU host; the delivery path (task, runner, pipeline, storage, result) is
the production one. Reports per-job wall, which worker and GPU ran it, and fleet throughput.

  python bench/fleet/fleet.py --gpus all --jobs 8 --size 832x480 --frames 81 --out fleet.json
  python bench/fleet/fleet.py --cpu 2 --jobs 4 --decoder pattern --size 256x256 --frames 41
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus")
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--decoder", default="wan2.1-vae")
    ap.add_argument("--size", default="832x480")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--out", default="bench/results/fleet.json")
    args = ap.parse_args()
    # SIGTERM (a test's time limit) ends this process through its finally: the launcher, in a
    # session of its own, is stopped too instead of outliving it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="fffleet-"))
    # The launcher's workers read these from their environment; this process gets the same
    # settings explicitly.
    env = {"FRAMEFLEET_BROKER_URL": "filesystem://", "FRAMEFLEET_DATA_DIR": str(work / "data"),
           "FRAMEFLEET_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"}
    from bench.report import write_json
    from producer.client import Client
    from producer.settings import Settings
    from producer.wire.spec import JobSpec

    settings = Settings(broker_url="filesystem://", data_dir=str(work / "data"), metrics_port=0)
    w, h = (int(v) for v in args.size.split("x"))
    t = (args.frames - 1) // 4 + 1
    latents = work / "z.npy"
    rng = np.random.default_rng(0)
    np.save(latents, rng.standard_normal((16, t, h // 8, w // 8), dtype=np.float32))
    cmd = [sys.executable, "-m", "producer.cli", "worker"]
    cmd += ["--gpus", args.gpus] if args.gpus else []
    cmd += ["--cpu", str(args.cpu)] if args.cpu else []
    log = (work / "launcher.log").open("wb")
    launcher = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    client = Client(settings=settings)
    try:
        deadline = time.monotonic() + 300
        while not client.ping(timeout=1.0):  # workers answer once ready (warm-up included)
            if time.monotonic() > deadline or launcher.poll() is not None:
                raise SystemExit((work / "launcher.log").read_text()[-3000:])
        workers = sorted(n for reply in client.ping(timeout=2.0) for n in reply)
        specs = [JobSpec.model_validate({
            "job_id": f"fleet-{i}", "tenant": "bench", "input": {"uri": latents.as_uri()},
            # The fleet's throughput, not a model's: the Wan decoder runs random weights.
            "decoder": {"name": args.decoder,
                        **({} if args.decoder == "pattern" else {"weights": "random"})},
            "video": {"segment_frames": 48},
            "output": {"uri": (work / "out").as_uri()}}) for i in range(args.jobs)]
        t0 = time.perf_counter()
        handles = [client.submit(s) for s in specs]
        results = [hdl.wait(timeout=1800) for hdl in handles]
        wall = time.perf_counter() - t0
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
        log.close()
    for r in results:  # every output complete: sizes and hashes of the files on disk
        m = r.manifest
        assert sum(s.frames for s in m.segments) == m.frames == args.frames
        for s in m.segments:
            path = Path(s.uri.removeprefix("file://"))
            assert path.stat().st_size == s.bytes
    report: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "workers": workers, "jobs": args.jobs, "size": args.size, "frames": args.frames,
        "decoder": args.decoder, "wall_s": wall, "jobs_per_s": args.jobs / wall,
        "per_job": [{"job_id": r.manifest.job_id, "node": r.worker.node, "device": r.worker.device,
                     "gpu": r.worker.gpu_name, "gpu_uuid": r.worker.gpu_uuid,
                     "wall_s": r.timings.wall_s, "decode_s": r.timings.decode_s,
                     "gpu_busy_ratio": r.timings.gpu_busy_ratio,
                     "cost_usd": r.cost.total_usd if r.cost else None} for r in results],
    }
    write_json(args.out, report)
    print(f"workers {workers}; {args.jobs} jobs in {wall:.2f} s ({args.jobs / wall:.2f} jobs/s)")
    for j in report["per_job"]:
        busy = j["gpu_busy_ratio"]
        print(f"  {j['job_id']}: {j['node']} {j['gpu'] or j['device']} wall {j['wall_s']:.2f} s "
              f"decode {j['decode_s']:.2f} s busy {busy if busy is None else round(busy, 4)}")


if __name__ == "__main__":
    main()
