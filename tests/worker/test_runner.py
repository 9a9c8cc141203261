"""The runner without Celery: outputs, manifest last, reuse, conflicts, OOM fallback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from producer.errors import DeviceOutOfMemory, JobConflictError
from producer.settings import get_settings
from producer.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec, segment_name
from worker.decoders.pattern import PatternDecoder
from worker.runner import DecoderCache, JobContext, run_job


@pytest.fixture(autouse=True)
def _file_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The runner's local paths are confined to FRAMEFLEET_FILE_ROOTS: allow the test's folder.
    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _spec(tmp: Path, job_id: str = "r1", **video: int) -> JobSpec:
    np.save(tmp / "z.npy", np.zeros((16, 4, 4, 6), np.float32))
    return JobSpec(job_id=job_id, input=InputSpec(uri=(tmp / "z.npy").as_uri()),
                   decoder=DecoderSpec(name="pattern"), video=VideoSpec(**video),
                   output=OutputSpec(uri=(tmp / "out").as_uri()))


def test_outputs_and_manifest(tmp_path: Path) -> None:
    spec = _spec(tmp_path, segment_frames=5)
    result = run_job(spec, DecoderCache(torch.device("cpu")))
    folder = tmp_path / "out" / "default" / "r1"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["index.m3u8", "manifest.json"] + [segment_name(i) for i in range(3)]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["frames"] == 13 == result.manifest.frames
    assert [s["first_frame"] for s in manifest["segments"]] == [0, 5, 10]
    assert result.manifest_uri == (folder / "manifest.json").as_uri()
    # The manifest is the last file written: no segment is newer
    newest_segment = max((folder / n).stat().st_mtime_ns for n in names if n != "manifest.json")
    assert (folder / "manifest.json").stat().st_mtime_ns >= newest_segment


def test_rerun_reuses_complete_output_and_refuses_other_spec(tmp_path: Path) -> None:
    cache = DecoderCache(torch.device("cpu"))
    first = run_job(_spec(tmp_path), cache)
    again = run_job(_spec(tmp_path), cache)
    assert again.reused and again.manifest.segments == first.manifest.segments
    with pytest.raises(JobConflictError, match="different spec"):
        run_job(_spec(tmp_path, crf=30), cache)


class _OomUnlessTiled(PatternDecoder):
    def __init__(self, tiled: bool = False) -> None:
        super().__init__()
        self.tiled = tiled

    def with_tiling(self) -> _OomUnlessTiled:
        return _OomUnlessTiled(tiled=True)

    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        if not self.tiled:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        yield from super().stream(latents)


class _Cache(DecoderCache):
    def get(self, spec: DecoderSpec) -> PatternDecoder:  # type: ignore[override]
        return _OomUnlessTiled()


def test_oom_is_retryable_and_tiled_attempt_succeeds(tmp_path: Path) -> None:
    cache = _Cache(torch.device("cpu"))
    with pytest.raises(DeviceOutOfMemory, match="tiled=False"):
        run_job(_spec(tmp_path), cache)
    result = run_job(_spec(tmp_path), cache, JobContext(tiled=True))
    assert result.manifest.frames == 13
