"""A CPU worker says, before it runs, that a job will take over a minute, with the estimate
(worker/run/estimate.py): a decode of Wan latents at a real size, a generate job of a real
model's configs; a tiny job gets no warning; the estimate of a small real decode is within a
small factor of the time it takes on this CPU."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from producer.settings import Settings
from producer.wire.spec import (
    DecoderSpec,
    InputSpec,
    JobSpec,
    OutputSpec,
    Progress,
    VideoSpec,
)
from tests.worker.generate.tiny import save_tiny_model, tiny_generate
from worker.decoders.wan import WanDecoder, build_vae
from worker.generate.model.presets import PRESETS
from worker.run import Run, default_decoders, run_job
from worker.run.estimate import WARN_OVER_S, decode_scale, estimate_s, matmul_flops, warn_if_slow
from worker.run.source import Latents

CPU = torch.device("cpu")


def _config_folder(folder: Path, preset: str) -> Path:
    """A Wan pipeline folder of ``preset``'s configs only (the estimate reads no weights)."""
    p = PRESETS[preset]
    index = {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
             "vae": ["diffusers", "AutoencoderKLWan"],
             "text_encoder": ["transformers", "UMT5EncoderModel"],
             "scheduler": ["diffusers", "UniPCMultistepScheduler"]}
    for part, config in (("transformer", p.transformer), ("vae", p.vae),
                         ("text_encoder", p.text_encoder)):
        (folder / part).mkdir(parents=True)
        (folder / part / "config.json").write_text(json.dumps(config))
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(p.scheduler))
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def _minutes(text: str) -> float:
    match = re.search(r"estimates ~(\d+) (s|min) for this job", text)
    assert match, text
    return float(match[1]) * (60 if match[2] == "min" else 1)


def test_a_real_size_generate_job_is_warned_before_it_runs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given a CPU worker and a job of Wan2.1 T2V 1.3B's configs at its own size, 50 steps
    folder = _config_folder(tmp_path / "wan13b", "wan2.1-t2v-1.3b")
    spec = JobSpec(job_id="big-1", generate=tiny_generate(
        folder, height=480, width=832, num_frames=81, num_inference_steps=50),
        output=OutputSpec(uri=(tmp_path / "out").as_uri()))
    run = Run(spec, settings=Settings(device="cpu", file_roots=str(tmp_path)))
    reports: list[Progress] = []
    run.progress_hooks.append(reports.append)
    # When the worker is about to start it
    with caplog.at_level(logging.WARNING, logger="worker.run.estimate"):
        warn_if_slow(run, CPU)
    # Then it says so at once: logged, and in a progress report before any step, with the
    # estimate, its parts and this CPU's speed
    assert run.warning is not None and _minutes(run.warning) > 10 * 60, run.warning
    assert "denoise ~" in run.warning and "decode ~" in run.warning
    assert re.search(r"this CPU runs \d+ GFLOP/s", run.warning), run.warning
    assert [r.message for r in caplog.records] == [f"job big-1: {run.warning}"]
    assert len(reports) == 1 and reports[0].warning == run.warning
    assert (reports[0].stage, reports[0].steps_done, reports[0].steps_total) == ("denoise", 0, 50)
    # and every later report carries it (the CLI's bar, status)
    run.report(Progress(frames_done=0, frames_total=81, segments_done=0, stage="denoise",
                        steps_done=1, steps_total=50))
    assert reports[-1].warning == run.warning


def test_a_decode_of_real_wan_latents_is_warned_and_the_estimate_is_near(
        tmp_path: Path) -> None:
    decoder = WanDecoder(build_vae("wan2.1"), CPU)
    # Given Wan2.1 latents of 81 frames at 480x832 (the example's 765 s on a CPU)
    run = Run(JobSpec(job_id="dec-1", input=InputSpec(uri=(tmp_path / "z.npy").as_uri()),
                      decoder=DecoderSpec(name="wan2.1-vae", weights="random"),
                      output=OutputSpec(uri=(tmp_path / "out").as_uri())),
              settings=Settings(device="cpu", file_roots=str(tmp_path)))
    warn_if_slow(run, CPU, Latents(decoder, torch.zeros(16, 21, 60, 104)))
    # Then it is warned, decode alone
    assert run.warning is not None and _minutes(run.warning) > WARN_OVER_S, run.warning
    assert "(decode ~" in run.warning and "denoise" not in run.warning
    # and the estimate of a small decode is near what it takes here (the probe measures the
    # same cores under the same load)
    z = torch.randn(16, 2, 16, 16)
    speed = matmul_flops()
    (estimate,) = estimate_s(speed, 5 * 128 * 128, scale=decode_scale(decoder.vae.config)
                             ).values()
    t0 = time.perf_counter()
    for _ in decoder.stream(z):
        pass
    took = time.perf_counter() - t0
    assert took / 4 < estimate < took * 4, (estimate, took)


def test_a_tiny_job_runs_without_a_warning(tmp_path: Path) -> None:
    # The tiny random model at the quickstart's size: seconds, no warning, whole job run
    model = save_tiny_model(tmp_path / "tiny-wan")
    spec = JobSpec(job_id="tiny-1", generate=tiny_generate(model, num_inference_steps=4),
                   output=OutputSpec(uri=(tmp_path / "out").as_uri()),
                   video=VideoSpec(segment_frames=4))
    run = Run(spec, settings=Settings(device="cpu", file_roots=str(tmp_path)))
    reports: list[Progress] = []
    run.progress_hooks.append(reports.append)
    result = run_job(spec, default_decoders(Settings(device="cpu")), run)
    assert result.manifest.frames == 9 and run.warning is None
    assert reports and not [r for r in reports if r.warning]
    # and the pattern decoder is never estimated
    np.save(tmp_path / "z.npy", np.zeros((16, 21, 60, 104), np.float32))
    pattern = Run(JobSpec(job_id="pat-1", input=InputSpec(uri=(tmp_path / "z.npy").as_uri()),
                          decoder=DecoderSpec(name="pattern"),
                          output=OutputSpec(uri=(tmp_path / "out").as_uri())))
    decoders = default_decoders(Settings(device="cpu"))
    warn_if_slow(pattern, CPU, Latents(decoders.get(pattern.spec.decoder),
                                       torch.zeros(16, 21, 60, 104)))
    assert pattern.warning is None
