"""A background graph build never traces while a job runs compiled code: the denoise holds
the process's ``TRACE`` gate for its whole loop (``worker.gate``). On the CPU with the tiny
pipeline: a build asked for during the denoise starts only once the denoise has ended."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest

from producer.settings import Settings
from producer.wire.spec import JobSpec, OutputSpec, Progress, VideoSpec
from tests.worker.generate.tiny import save_tiny_model, tiny_generate
from worker.gate import TRACE
from worker.run import Run, default_decoders, run_job

SETTINGS = Settings(device="cpu", max_denoise_steps=50, file_roots=tempfile.gettempdir())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")


def test_a_build_asked_for_mid_denoise_waits_for_its_end(model: Path, tmp_path: Path) -> None:
    spec = JobSpec(job_id="trace", generate=tiny_generate(model, num_inference_steps=12),
                   output=OutputSpec(uri=tmp_path.as_uri()), video=VideoSpec(segment_frames=4))
    marks: dict[str, float] = {}
    asked = threading.Event()

    def build() -> None:  # what a background decode-graph build does around its compile
        asked.wait(60)
        with TRACE.capture():
            marks["build"] = time.monotonic()

    def progress(p: Progress) -> None:
        if p.stage == "denoise" and p.steps_done == 2:
            asked.set()
            time.sleep(0.2)  # the build has asked by now
        if p.stage == "denoise" and p.steps_done == p.steps_total:
            marks["denoised"] = time.monotonic()

    t = threading.Thread(target=build)
    t.start()
    run = Run(spec, settings=SETTINGS, progress_hooks=[progress])
    waits = TRACE.waits
    run_job(spec, default_decoders(SETTINGS), run)
    t.join(30)
    assert marks["build"] >= marks["denoised"], marks
    assert TRACE.waits == waits + 1
