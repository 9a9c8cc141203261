"""Previews of a run, end to end in this process on the tiny random Wan pipeline, to a
``file://`` output: in order with their steps, each a clip PyAV decodes at the size and frame
count announced; the worker's default and ``every: 0``; ``latest.mp4`` read while it is
replaced; a store that refuses them; a cancel; the stage timing and the cost."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import av
import pytest

from producer.cost import cost_for_job
from producer.errors import JobCancelled
from producer.settings import Settings
from producer.wire.spec import JobSpec, OutputSpec, PreviewInfo, Progress, VideoSpec
from tests.worker.generate.tiny import save_tiny_model, tiny_generate
from worker.run import Run, default_decoders, run_job
from worker.run.decoders import DecoderCache
from worker.run.previews import PreviewPublisher


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> DecoderCache:
    return default_decoders(Settings(device="cpu"))


def _settings(tmp_path: Path, model: Path, **kw: Any) -> Settings:
    return Settings(device="cpu", max_denoise_steps=500, file_roots=f"{tmp_path}:{model.parent}",
                    **kw)


def _spec(job_id: str, tmp_path: Path, model: Path, **gen: Any) -> JobSpec:
    return JobSpec(job_id=job_id, generate=tiny_generate(model, **gen),
                   output=OutputSpec(uri=(tmp_path / "out").as_uri()),
                   video=VideoSpec(segment_frames=4))


def _decode(path_or_bytes: Path | bytes) -> list[Any]:
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else path_or_bytes.read_bytes()
    with av.open(io.BytesIO(data)) as f:
        return [frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)]


def _folder(tmp_path: Path, job_id: str) -> Path:
    return tmp_path / "out" / "default" / job_id / "previews"


def test_previews_land_in_order_and_decode_as_announced(
        tmp_path: Path, model: Path, decoders: DecoderCache) -> None:
    # Given a 10-step job that asks for a preview every 3 steps
    spec = _spec("p1", tmp_path, model, num_inference_steps=10, preview={"every": 3})
    run = Run(spec, settings=_settings(tmp_path, model), cost=cost_for_job)
    landed: list[PreviewInfo] = []
    reports: list[Progress] = []
    run.preview_hooks.append(landed.append)
    run.progress_hooks.append(reports.append)
    result = run_job(spec, decoders, run)
    # Then steps 1 (the first preview comes at once), 3, 6 and 9 were stored and announced,
    # in that order
    assert [p.step for p in landed] == [1, 3, 6, 9] and {p.steps_total for p in landed} == {10}
    folder = _folder(tmp_path, "p1")
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest.mp4", "step-0001.mp4", "step-0003.mp4", "step-0006.mp4", "step-0009.mp4"]
    for p in landed:
        # each decodes at the size and frame count it states: the 6x4 latent grid x4, one
        # frame per latent frame (9 frames: 3), a quarter of the video's rate
        assert p.uri == (folder / f"step-{p.step:04d}.mp4").as_uri()
        assert p.latest_uri == (folder / "latest.mp4").as_uri()
        assert (p.width, p.height, p.frames, p.fps) == (24, 16, 3, spec.video.fps / 4)
        frames = _decode(Path(p.uri.removeprefix("file://")))
        assert len(frames) == p.frames and frames[0].shape == (p.height, p.width, 3)
    assert (folder / "latest.mp4").read_bytes() == (folder / "step-0009.mp4").read_bytes()
    # and every progress report after the first preview carries the newest one
    shown = [(r.steps_done, r.preview.step if r.preview else 0) for r in reports
             if r.stage == "denoise"]
    assert all(step <= n for n, step in shown), shown  # never ahead of the denoise
    assert [step for _, step in shown] == sorted(step for _, step in shown)
    assert reports[-1].preview is not None and reports[-1].preview.step == 9
    # and the manifest, the stage timings and the cost say so
    facts = result.manifest.generate
    assert facts is not None and (facts.preview_every, facts.previews) == (3, 4)
    assert result.timings.preview_s > 0
    assert result.cost is not None
    stages = {s.stage: s for s in result.cost.stages}
    assert list(stages) == ["text_encode", "denoise", "preview", "decode", "upload_wait", "s3"]
    assert stages["preview"].gpu_seconds == pytest.approx(result.timings.preview_s)


def test_the_workers_default_applies_and_every_0_writes_none(
        tmp_path: Path, model: Path, decoders: DecoderCache) -> None:
    settings = _settings(tmp_path, model)
    # A job that does not say gets the worker's FRAMEFLEET_PREVIEW_EVERY, every 2 steps unless
    # its operator says: a preview after step 1, then steps 2 and 4
    spec = _spec("d1", tmp_path, model, num_inference_steps=4)
    result = run_job(spec, decoders, Run(spec, settings=settings))
    assert sorted(p.name for p in _folder(tmp_path, "d1").iterdir()) == [
        "latest.mp4", "step-0001.mp4", "step-0002.mp4", "step-0004.mp4"]
    assert result.manifest.generate is not None
    assert result.manifest.generate.preview_every == 2
    # and one with every 0 writes none, whatever the default
    spec = _spec("d0", tmp_path, model, num_inference_steps=4, preview={"every": 0})
    run = Run(spec, settings=settings)
    run.preview_hooks.append(lambda p: pytest.fail(f"a preview: {p}"))
    result = run_job(spec, decoders, run)
    assert not _folder(tmp_path, "d0").exists()
    assert result.manifest.generate is not None
    assert (result.manifest.generate.preview_every, result.manifest.generate.previews) == (0, 0)
    assert result.timings.preview_s == 0
    assert result.cost is None or "preview" not in [s.stage for s in result.cost.stages]


def test_latest_is_never_half_written_when_read(
        tmp_path: Path, model: Path, decoders: DecoderCache) -> None:
    # Given a job that replaces latest.mp4 after every one of its 60 steps
    spec = _spec("l1", tmp_path, model, num_inference_steps=60, preview={"every": 1})
    run = Run(spec, settings=_settings(tmp_path, model))
    latest = _folder(tmp_path, "l1") / "latest.mp4"
    done = threading.Event()
    reads: list[bytes] = []

    def read() -> None:
        while not done.is_set():
            try:
                reads.append(latest.read_bytes())
            except FileNotFoundError:
                pass  # not written yet
            time.sleep(0.001)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        run_job(spec, decoders, run)
    finally:
        done.set()
        reader.join()
    # Then every read, however it fell between two writes, was one whole clip
    versions = set(reads)
    assert len(versions) >= 5, len(versions)
    for data in versions:
        assert len(_decode(data)) == 3


def test_a_store_that_refuses_previews_never_fails_the_job(
        tmp_path: Path, model: Path, decoders: DecoderCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (the writer takes what its queue holds: on a loaded machine a later preview can find it
    # full and be dropped, by design, so the failures are counted against what it took)
    taken: list[bool] = []
    offer = PreviewPublisher.offer
    monkeypatch.setattr(PreviewPublisher, "offer",
                        lambda self, shot: taken.append(offer(self, shot)) or taken[-1])
    # Given a job folder where previews/ cannot be made (a file is in its place)
    spec = _spec("f1", tmp_path, model, num_inference_steps=6, preview={"every": 2})
    job = tmp_path / "out" / "default" / "f1"
    job.mkdir(parents=True)
    (job / "previews").write_bytes(b"in the way")
    run = Run(spec, settings=_settings(tmp_path, model))
    failures: list[BaseException] = []
    run.preview_failure_hooks.append(failures.append)
    run.preview_hooks.append(lambda p: pytest.fail(f"announced: {p}"))
    result = run_job(spec, decoders, run)
    # Then each preview failed on its own (each one tried again) and the job succeeded whole
    assert len(taken) == 4  # offered after steps 1, 2, 4 and 6; the first two always fit
    assert len(failures) == sum(taken) >= 2, (failures, taken)
    assert result.manifest.generate is not None and result.manifest.generate.previews == 0
    frames = sum(len(_decode(Path(s.uri.removeprefix("file://"))))
                 for s in result.manifest.segments)
    assert frames == result.manifest.frames == 9
    assert (job / "previews").read_bytes() == b"in the way"


def test_a_cancelled_job_publishes_no_preview_after_its_end(
        tmp_path: Path, model: Path, decoders: DecoderCache) -> None:
    # Given a long job that makes a preview every step, cancelled once three have landed
    spec = _spec("c1", tmp_path, model, num_inference_steps=300, preview={"every": 1})
    run = Run(spec, settings=_settings(tmp_path, model))
    landed: list[int] = []
    run.preview_hooks.append(lambda p: landed.append(p.step))
    run.cancel_checks.append(lambda: len(landed) >= 3)
    with pytest.raises(JobCancelled):
        run_job(spec, decoders, run)
    # When the run has ended, what is stored and announced stays as it was
    folder = _folder(tmp_path, "c1")
    stored = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    announced = list(landed)
    time.sleep(1.0)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stored
    assert landed == announced and 3 <= len(announced) < 300
    assert announced == sorted(announced)
    assert not list((tmp_path / "out" / "default" / "c1").glob("manifest.json"))


def test_the_preview_stage_is_priced_within_what_the_job_held() -> None:
    from types import SimpleNamespace

    from producer.cost import with_stages
    from producer.cost.model import job_cost
    from producer.cost.pricing import default_catalog, prices_for
    from worker.run.finish import _cost_seconds
    from worker.run.source import Latents

    direct = job_cost(tenant="t", prices=prices_for("g7e.2xlarge", "on-demand",
                                                    default_catalog()),
                      gpu_seconds=10.0, s3_puts=4, stored_bytes=1000, video_seconds=5.0)
    latents = Latents(decoder=None, tensor=None,  # type: ignore[arg-type]
                      seconds={"text_encode": 1.0, "denoise": 6.0})
    # The projection (0.5 s of GPU) ran inside the denoise: it moves to the preview stage
    previews = SimpleNamespace(seconds=0.8, gpu_s=0.5)
    # and the device waited 0.7 s for the encode and upload (a full ring, the tail)
    seconds = _cost_seconds(latents, previews, 10.0, 0.7)  # type: ignore[arg-type]
    assert seconds == {"adapter_load": 0.0, "text_encode": 1.0, "denoise": 5.5, "preview": 0.8,
                       "upload_wait": 0.7}
    stages = {s.stage: s for s in with_stages(direct, seconds).stages}
    assert list(stages) == ["text_encode", "denoise", "preview", "decode", "upload_wait", "s3"]
    assert stages["decode"].gpu_seconds == pytest.approx(10.0 - 1.0 - 5.5 - 0.8 - 0.7)
    # encodes that outlast what the job held (they overlap it) are priced within it
    seconds = _cost_seconds(latents, SimpleNamespace(seconds=9.0, gpu_s=0.5), 10.0, 0.0)  # type: ignore[arg-type]
    assert seconds["preview"] == pytest.approx(3.5)
    assert sum(with_stages(direct, seconds).stages[i].share for i in range(5)) == pytest.approx(1)
    # no previews: no preview stage
    assert "preview" not in [s.stage for s in with_stages(
        direct, _cost_seconds(latents, None, 10.0, 0.0)).stages]
