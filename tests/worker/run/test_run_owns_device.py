"""A run owns the device (``worker.owner``): on the CPU with the tiny pipeline, a build queued
mid-denoise (a new decode size met by the job) starts only once the whole run has ended, and a
run that starts during a build waits for that build, then runs."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest

from producer.settings import Settings
from producer.wire.spec import JobSpec, OutputSpec, Progress, VideoSpec
from tests.worker.generate.tiny import save_tiny_model, tiny_generate
from worker.owner import DEVICE
from worker.run import Run, default_decoders, run_job

SETTINGS = Settings(device="cpu", max_denoise_steps=50, file_roots=tempfile.gettempdir())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")


def _spec(model: Path, out: Path, job_id: str) -> JobSpec:
    return JobSpec(job_id=job_id, generate=tiny_generate(model, num_inference_steps=12),
                   output=OutputSpec(uri=out.as_uri()), video=VideoSpec(segment_frames=4))


def test_a_build_queued_mid_denoise_waits_for_the_run_to_end(model: Path,
                                                             tmp_path: Path) -> None:
    marks: dict[str, float] = {}

    def build() -> None:  # what a decode-graph build does: compile, warm, capture
        marks["build"] = time.monotonic()

    def progress(p: Progress) -> None:
        marks["last_progress"] = time.monotonic()  # the run's last report: its segments' end
        if p.stage == "denoise" and p.steps_done == 2:
            assert DEVICE.submit("test-mid-denoise", build)
            time.sleep(0.2)  # a builder that ignored the job would have run by now
            assert "build" not in marks

    spec = _spec(model, tmp_path, "owner-mid")
    run_job(spec, default_decoders(SETTINGS), Run(spec, settings=SETTINGS,
                                                   progress_hooks=[progress]))
    assert DEVICE.drain(30)
    assert marks["build"] >= marks["last_progress"]


def test_a_run_that_starts_during_a_build_waits_for_it(model: Path, tmp_path: Path) -> None:
    building, release = threading.Event(), threading.Event()
    marks: dict[str, float] = {}

    def build() -> None:
        building.set()
        release.wait(30)
        marks["build_end"] = time.monotonic()

    def progress(p: Progress) -> None:
        marks.setdefault("first_progress", time.monotonic())

    assert DEVICE.submit("test-long-build", build)
    assert building.wait(30)
    threading.Timer(0.3, release.set).start()
    waits = DEVICE.stats.job_waits
    spec = _spec(model, tmp_path, "owner-wait")
    run_job(spec, default_decoders(SETTINGS), Run(spec, settings=SETTINGS,
                                                   progress_hooks=[progress]))
    assert marks["first_progress"] >= marks["build_end"]
    assert DEVICE.stats.job_waits == waits + 1
