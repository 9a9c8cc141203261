"""The OOM fallback: a device out-of-memory runs the job again at once, tiled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from celery import Celery

from producer.app import make_app
from producer.errors import FatalJobError
from producer.settings import Settings, get_settings
from producer.wire.spec import DecoderSpec, JobResult
from tests.worker.concerns.scripted import Scripted, counts, job_spec, real_work
from worker import tasks
from worker.decoders.pattern import PatternDecoder
from worker.run import DecoderCache


class _OomUnlessTiled(PatternDecoder):
    def __init__(self, fits_tiled: bool, tiled: bool = False) -> None:
        super().__init__()
        self.fits_tiled, self.tiled = fits_tiled, tiled

    def with_tiling(self) -> _OomUnlessTiled:
        return _OomUnlessTiled(self.fits_tiled, tiled=True)

    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        if not (self.tiled and self.fits_tiled):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        yield from super().stream(latents)


class _Cache(DecoderCache):
    def __init__(self, fits_tiled: bool) -> None:
        super().__init__(torch.device("cpu"))
        self.fits_tiled = fits_tiled

    def get(self, spec: DecoderSpec) -> PatternDecoder:
        return _OomUnlessTiled(self.fits_tiled)


@pytest.mark.parametrize("fits_tiled", [True, False])
def test_out_of_memory_runs_again_tiled_outside_the_budget(
    app: Celery, tmp_path: Path, tenant: str, fits_tiled: bool
) -> None:
    # Given a decoder that runs out of memory unless tiled (and, tiled, fits or not)
    spec = job_spec(tmp_path, tenant)
    settings = Settings(file_roots=str(tmp_path), retry_max=0)
    scripted = Scripted(app, spec, settings, real_work(_Cache(fits_tiled)))
    # When the task runs with no retry budget at all
    result = scripted.apply(spec.key)
    # Then it ran once more at once, tiled; a tiled OOM is fatal, naming both attempts
    assert scripted.attempts == 2
    assert [run.tiled for run in scripted.runs] == [False, True]
    if fits_tiled:
        assert result.state == "SUCCESS"
        assert counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}
    else:
        assert result.state == "FAILURE"
        assert isinstance(result.result, FatalJobError)
        assert "the smaller working set did not fit either" in str(result.result)
        assert counts(tenant) == {"success": 0, "failure": 1, "retry": 1, "cancelled": 0}


def test_decode_video_registered_on_one_app_runs_a_job(
    app: Celery, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the real task registered on this app only, and an OOM on the first attempt
    monkeypatch.setattr(tasks, "_decoders", _Cache(fits_tiled=True))
    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    get_settings.cache_clear()
    try:
        task = tasks.register(app)
        other = make_app("memory://", "cache+memory://")
        spec = job_spec(tmp_path, tenant)
        # When it runs (eagerly, through Celery's retry)
        result = task.apply(args=[spec.model_dump(mode="json")], task_id=spec.key)
    finally:
        get_settings.cache_clear()
    # Then the job succeeded tiled, and the other app never got the task
    assert result.state == "SUCCESS", result.traceback
    assert JobResult.model_validate(result.result).manifest.job_id == spec.job_id
    assert task.name not in other.tasks
    assert counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}
