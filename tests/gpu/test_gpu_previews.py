"""Previews on a real GPU (``pytest -m gpu``): the projection is queued on the device, copied
non-blocking into pinned memory and waited for on its event by the writer alone (never a
device-wide synchronisation in the denoise), the clip equals the CPU's projection of the same
x0, and a whole job's latents are the same with previews as without."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from producer.settings import Settings
from producer.wire.spec import GenerateSpec, JobSpec, OutputSpec, VideoSpec
from worker.generate.denoise.preview import Previews, Shot
from worker.generate.model.cache import ModelCache
from worker.generate.model.presets import build_pipeline, save_configs
from worker.run import DecoderCache, Run, run_job

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda", 0)


class Sink:
    def __init__(self) -> None:
        self.shots: list[Shot] = []
        self.failures: list[BaseException] = []

    def offer(self, shot: Shot) -> bool:
        self.shots.append(shot)
        return True

    def failed(self, error: BaseException) -> None:
        self.failures.append(error)


@pytest.mark.parametrize("channels", [16, 48])
def test_the_projection_waits_on_its_event_only(channels: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    x0 = torch.randn(1, channels, 21, 30, 52, device=CUDA)
    cpu_sink = Sink()
    cpu = Previews(1, cpu_sink)
    assert cpu.start(channels, (21, 30, 52), torch.device("cpu"))
    cpu(1, 1, x0.cpu())
    sink = Sink()
    previews = Previews(1, sink)
    assert previews.start(channels, (21, 30, 52), CUDA)

    def no(*args: Any) -> None:
        raise AssertionError("a device-wide synchronisation in the denoise path")

    monkeypatch.setattr(torch.cuda, "synchronize", no)
    previews(1, 1, x0)
    monkeypatch.undo()
    (shot,) = sink.shots
    assert shot.host.is_pinned() and shot.events is not None and not sink.failures
    clip, seconds = shot.take()
    assert seconds > 0
    (want,) = cpu_sink.shots
    expected, _ = want.take()
    assert clip.shape == expected.shape == (21, 30, 52, 3)
    assert abs(clip.astype(int) - expected.astype(int)).max() <= 1


def test_a_job_with_previews_has_the_latents_of_one_without() -> None:
    from safetensors.torch import load_file

    root = Path(tempfile.mkdtemp(prefix="ff-gpu-previews-"))
    settings = Settings(device="cuda", file_roots=str(root), work_dir=str(root))
    models = ModelCache(CUDA, 2**40)
    pipe = build_pipeline("tiny", CUDA, torch.bfloat16, seed=0)
    folder = save_configs(pipe, root / "tiny")
    models.adopt(folder, pipe, "exact")
    decoders = DecoderCache(CUDA, models=models)

    def job(job_id: str, **extra: Any) -> tuple[Any, torch.Tensor]:
        gen = GenerateSpec(model=folder.as_uri(), prompt="a fox", height=32, width=48,
                           num_frames=9, num_inference_steps=6, seed=1, save_latents=True,
                           **extra)
        spec = JobSpec(job_id=job_id, generate=gen, output=OutputSpec(uri=(root / "out").as_uri()),
                       video=VideoSpec(segment_frames=4))
        result = run_job(spec, decoders, Run(spec, settings=settings))
        assert result.manifest.latents_uri is not None
        return result, load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]

    _, plain = job("plain")
    result, watched = job("previews", preview={"every": 2})
    assert torch.equal(watched, plain)
    # after steps 1, 2, 4 and 6 at most: one that finds the writer still busy with the last
    # is dropped by design (the denoise never waits for a preview)
    assert result.manifest.generate is not None and 1 <= result.manifest.generate.previews <= 4
    assert result.timings.preview_s > 0
