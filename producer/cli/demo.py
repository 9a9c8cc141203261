"""``framefleet demo``: the main job on the embedded default, no server at all.

Celery's ``filesystem://`` broker and a ``db+sqlite`` result backend live in a local folder,
one real worker process runs the task, outputs go to ``file://``. Single host only.

The Wan decoder runs with random weights (``decoder.weights: "random"``): the demo shows the
fleet's machinery, not a model, so its frames are noise, and its output says so.

``--generate`` runs a prompt job instead (``--image``: an image-to-video job) on a tiny random
Wan2.2 TI2V-layout pipeline that the worker's own entry point writes first (``python -m worker
models tiny``; the producer never imports ``worker``): a prompt (and an image) in, MP4 segments
out, through the same worker and pipeline as real weights. Its video is noise too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from producer.app import worker_command
from producer.client import Client
from producer.settings import Settings
from producer.wire.spec import (
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


def tiny_model(folder: Path) -> Path:
    """The demo's tiny random model (Wan2.2 TI2V layout: a prompt and/or a first frame),
    written by the worker's entry point unless it is there already."""
    if not (folder / "model_index.json").is_file():
        done = subprocess.run([sys.executable, "-m", "worker", "models", "tiny", str(folder),
                               "--layout", "ti2v"], capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"writing the demo model failed: {done.stderr.strip()[-2000:]}")
    return folder


def generate_spec(out: Path, frames: int, width: int, height: int, steps: int,
                  image: Path | None) -> dict[str, Any]:
    """The ``generate`` part of the demo's prompt job, its files under ``out`` (the roots)."""
    generate: dict[str, Any] = {
        "model": tiny_model(out / "models" / "tiny-ti2v").as_uri(),
        "prompt": "a red fox runs through deep snow at dawn", "width": width, "height": height,
        "num_frames": frames, "num_inference_steps": steps, "guidance_scale": 5.0, "seed": 0,
    }
    if image is not None:  # copied under the demo's folder: the worker reads only there
        copy = out / "input" / f"image{image.suffix.lower() or '.png'}"
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image, copy)
        generate["image"] = copy.as_uri()
    return generate


def run_demo(decoder: str, frames: int, out: Path, width: int, height: int,
             timeout: float = 600.0, generate: bool = False, image: Path | None = None,
             steps: int = 4) -> tuple[JobResult, float]:
    """Run one job through a real embedded-mode worker; returns the result and wall seconds.
    ``generate``: a prompt job (with ``image``: image to video) on a tiny random model."""
    out = out.absolute()
    data_dir = out / ".framefleet"
    # The worker process reads the embedded mode from its environment; this process gets
    # the same settings explicitly.
    env = {k: v for k, v in os.environ.items() if k != "FRAMEFLEET_RESULT_BACKEND"}
    # The demo's records go to a ledger of its own: inherited, the fleet's ledger would count
    # the demo's runs in `framefleet cost report` among the fleet's jobs.
    env.update(FRAMEFLEET_BROKER_URL="filesystem://", FRAMEFLEET_DATA_DIR=str(data_dir),
               FRAMEFLEET_LEDGER_URI=(data_dir / "ledger").as_uri())
    settings = Settings(broker_url="filesystem://", data_dir=str(data_dir), result_backend=None)
    job: dict[str, Any] = {
        "job_id": f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", "tenant": "demo",
        "video": VideoSpec(fps=16, segment_frames=16),
        "output": OutputSpec(uri=(out / "videos").as_uri()),
    }
    if generate:
        job["generate"] = generate_spec(out, frames, width, height, steps, image)
    else:
        latents = write_latents(out / "input" / "latents.npy", frames, height, width)
        job["input"] = InputSpec(uri=latents.as_uri())
        job["decoder"] = (DecoderSpec(name="pattern") if decoder == "pattern"
                          else DecoderSpec(name="wan2.1-vae", weights=RANDOM_WEIGHTS))
    spec = JobSpec(**job)
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
