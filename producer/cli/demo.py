"""``framefleet demo``: the main job on the embedded default, no server at all.

Celery's ``filesystem://`` broker and a ``db+sqlite`` result backend live in a local folder,
one real worker process runs the task, outputs go to ``file://``. Single host only.

The Wan decoder runs with random weights (``decoder.weights: "random"``): the demo shows the
fleet's machinery, not a model, so its frames are noise, and its output says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from producer.app import worker_command
from producer.client import Client
from producer.settings import Settings
from producer.spec import (
    RANDOM_WEIGHTS,
    DecoderSpec,
    InputSpec,
    JobResult,
    JobSpec,
    OutputSpec,
    VideoSpec,
)


def write_latents(path: Path, frames: int, height: int, width: int, seed: int = 0) -> Path:
    """Synthetic latents (16, T, h, w) as .npy for ``frames`` video frames of height×width."""
    import numpy as np

    t = (frames - 1) // 4 + 1
    rng = np.random.default_rng(seed)
    latents = rng.standard_normal((16, t, height // 8, width // 8), dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, latents, allow_pickle=False)
    return path


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = worker_command("demo@%h", events=False, alone=True)
    with log.open("wb") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # warm shutdown
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def run_demo(decoder: str, frames: int, out: Path, width: int, height: int,
             timeout: float = 600.0) -> tuple[JobResult, float]:
    """Run one job through a real embedded-mode worker; returns the result and wall seconds."""
    out = out.absolute()
    data_dir = out / ".framefleet"
    # The worker process reads the embedded mode from its environment; this process gets
    # the same settings explicitly.
    env = {k: v for k, v in os.environ.items() if k != "FRAMEFLEET_RESULT_BACKEND"}
    env.update(FRAMEFLEET_BROKER_URL="filesystem://", FRAMEFLEET_DATA_DIR=str(data_dir))
    settings = Settings(broker_url="filesystem://", data_dir=str(data_dir), result_backend=None)
    latents = write_latents(out / "input" / "latents.npy", frames, height, width)
    spec = JobSpec(
        job_id=f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
        tenant="demo",
        input=InputSpec(uri=latents.as_uri()),
        decoder=DecoderSpec(name="pattern") if decoder == "pattern"
        else DecoderSpec(name="wan2.1-vae", weights=RANDOM_WEIGHTS),
        video=VideoSpec(fps=16, segment_frames=16),
        output=OutputSpec(uri=(out / "videos").as_uri()),
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    worker = start_worker(env, data_dir / "worker.log")
    try:
        client = Client(settings=settings)
        t0 = time.perf_counter()
        handle = client.submit(spec)
        result = handle.wait(timeout=timeout, progress=True)
        return result, time.perf_counter() - t0
    finally:
        stop_worker(worker)
