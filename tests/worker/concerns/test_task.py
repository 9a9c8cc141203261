"""The task body's own checks on receipt, before any concern runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from celery import Celery

from producer.errors import FatalJobError
from producer.settings import get_settings
from tests.worker.concerns.scripted import job_spec
from worker import tasks
from worker.run import DecoderCache


def test_output_outside_the_fleet_prefix_fails_at_once_naming_the_field(
    app: Celery, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "_decoders", DecoderCache(torch.device("cpu")))
    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    spec = job_spec(tmp_path, tenant)
    task = tasks.register(app)
    results = {}
    for prefix in (f"{(tmp_path / 'out').as_uri()}/", (tmp_path / "elsewhere").as_uri(),
                   f"{(tmp_path / 'ou').as_uri()}"):
        monkeypatch.setenv("FRAMEFLEET_OUTPUT_PREFIX", prefix)
        get_settings.cache_clear()
        try:
            job = spec.model_copy(update={"job_id": f"{spec.job_id}-{len(results)}"})
            results[prefix] = task.apply(args=[job.model_dump(mode="json")], task_id=job.job_id)
        finally:
            get_settings.cache_clear()
    inside, outside, sibling = results.values()
    assert inside.state == "SUCCESS", inside.traceback
    for refused in (outside, sibling):
        assert refused.state == "FAILURE"
        assert isinstance(refused.result, FatalJobError)
        assert str(refused.result).startswith("output.uri: ")
        assert "FRAMEFLEET_OUTPUT_PREFIX" in str(refused.result)
