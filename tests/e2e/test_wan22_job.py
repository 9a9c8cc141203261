"""A Wan2.2 (TI2V-5B layout) job through a real worker, Redis and S3: the 48-channel decoder
streams it at 16× the latent size and Wan2.2-5B's 24 fps; Wan2.1 latents fail at once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from safetensors.torch import save

from producer.client import Client
from producer.errors import JobFailed
from producer.settings import Settings
from producer.state.readiness import live_states, not_ready, state_dir
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec
from worker.pipeline.encode import read_frames_rgb

pytestmark = pytest.mark.e2e


def _put(s3: Any, bucket: str, key: str, channels: int, frames: int) -> str:
    z = torch.randn(channels, frames, 4, 6, generator=torch.Generator().manual_seed(channels))
    s3.client().put_object(Bucket=bucket, Key=key, Body=save({"latents": z}))
    return f"s3://{bucket}/{key}"


def _spec(job_id: str, uri: str, bucket: str) -> JobSpec:
    return JobSpec(job_id=job_id, tenant="e2e", input=InputSpec(uri=uri),
                   decoder=DecoderSpec(name="wan2.2-vae", preset="tiny-wan2.2", weights="random"),
                   video=VideoSpec(segment_frames=8), output=OutputSpec(uri=f"s3://{bucket}/out"))


def test_wan22_job_through_a_real_worker(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    work = tmp_path / "work"
    work.mkdir()
    # Given a worker that warms up (the pattern decoder: no compile on the CPU) and reports
    worker_factory(env={"FRAMEFLEET_WORK_DIR": str(work), "FRAMEFLEET_WARMUP_DECODER": "pattern"})
    client = Client(broker_url=redis_url, backend_url=redis_url)
    # then it becomes ready by its state file (what `framefleet healthcheck` reads)
    settings = Settings(work_dir=str(work))
    deadline = time.monotonic() + 60
    while not_ready(settings) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not_ready(settings) == []
    states = live_states(state_dir(settings))
    assert len(states) == 1 and states[0].ready and states[0].decoder == "pattern"
    # When a Wan2.2 job (48-channel latents, 3 latent frames) is submitted
    uri = _put(s3, s3_bucket, "in/wan22.safetensors", channels=48, frames=3)
    result = client.submit(_spec("wan22-ok", uri, s3_bucket)).wait(timeout=240)
    # Then the video is 16× the latents, 1 + 4·2 frames, at the model's 24 fps
    m = result.manifest
    assert (m.width, m.height, m.frames, m.fps) == (96, 64, 9, 24.0)
    data = s3.client().get_object(Bucket=s3_bucket,
                                  Key="out/e2e/wan22-ok/segment-00000.mp4")["Body"].read()
    (tmp_path / "s0.mp4").write_bytes(data)
    frames = read_frames_rgb(tmp_path / "s0.mp4")
    assert len(frames) == 8 and frames[0].shape == (64, 96, 3)
    # And Wan2.1's 16-channel latents given to the 48-channel decoder fail at once, naming
    # the input, and the worker goes on
    bad = _put(s3, s3_bucket, "in/wan21.safetensors", channels=16, frames=2)
    with pytest.raises(JobFailed, match="16 latent channels, the decoder expects 48"):
        client.submit(_spec("wan22-bad", bad, s3_bucket)).wait(timeout=120)
    again = client.submit(_spec("wan22-again", uri, s3_bucket)).wait(timeout=240)
    assert again.manifest.frames == 9
