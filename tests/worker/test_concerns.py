"""The task's concerns through Celery's own retry machinery, against a real Redis backend.

Tasks run eagerly (``Task.apply``): Celery executes a retry at once in the same process
(countdowns are not waited for), so a test sees every attempt, the final state, and what the
concerns recorded on the way: the backend's PROGRESS/REVOKED states, the cancel flags, the
``framefleet_jobs_total`` counters.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch
from celery import Celery, Task

from producer.app import make_app
from producer.control import flags_for
from producer.errors import DeviceOutOfMemory, FatalJobError, JobCancelled, StorageError
from producer.settings import Settings, get_settings
from producer.spec import (
    DecoderSpec,
    InputSpec,
    JobResult,
    JobSpec,
    OutputSpec,
    Progress,
    VideoSpec,
)
from worker import tasks
from worker.concerns import CONCERNS, Concern, Outcome, TaskRun, run_concerns
from worker.concerns.retries import backoff
from worker.decoders.pattern import PatternDecoder
from worker.metrics import JOBS, RETRIES
from worker.run.runner import DecoderCache, JobContext, run_job
from worker.sinks.hls import PLAYLIST

Work = Callable[[TaskRun, JobContext, int], JobResult]


@pytest.fixture
def app(redis_url: str) -> Celery:
    return make_app(redis_url, redis_url)


@pytest.fixture
def tenant(monkeypatch: pytest.MonkeyPatch) -> str:
    """A tenant of its own, so the counters a test reads are its own (allowed in the metrics'
    tenant label: the Settings a test builds read it)."""
    name = f"t-{secrets.token_hex(4)}"
    monkeypatch.setenv("FRAMEFLEET_METRICS_TENANTS", name)
    return name


def _spec(tmp: Path, tenant: str) -> JobSpec:
    np.save(tmp / "z.npy", np.zeros((16, 4, 4, 6), np.float32))
    return JobSpec(job_id=f"c-{secrets.token_hex(6)}", tenant=tenant,
                   input=InputSpec(uri=(tmp / "z.npy").as_uri()),
                   decoder=DecoderSpec(name="pattern"),
                   output=OutputSpec(uri=(tmp / "out").as_uri()))


def _jobs(status: str, tenant: str) -> float:
    """Ends (success, failure, cancelled) of any reason; "retry": retries and requeues."""
    counter, name = (RETRIES, "framefleet_job_retries_total") if status == "retry" else (
        JOBS, "framefleet_jobs_total")
    key = "kind" if status == "retry" else "status"
    return sum(sample.value for sample in next(iter(counter.collect())).samples
               if sample.name == name and sample.labels["tenant"] == tenant
               and (status == "retry" or sample.labels[key] == status))


def _counts(tenant: str) -> dict[str, float]:
    return {s: _jobs(s, tenant) for s in ("success", "failure", "retry", "cancelled")}


class Scripted:
    """A task on ``app`` that runs ``work`` inside ``concerns``; ``attempts`` counts runs."""

    def __init__(self, app: Celery, spec: JobSpec, settings: Settings, work: Work,
                 concerns: tuple[Callable[[TaskRun], Concern], ...] = CONCERNS) -> None:
        self.attempts = 0
        self.runs: list[TaskRun] = []

        def body(task: Task, tiled: bool = False, error_retries: int = 0,
                 requeues: int = 0) -> dict[str, Any]:
            self.attempts += 1
            run = TaskRun(task=task, spec=spec, settings=settings, flags=flags_for(app),
                          tiled=tiled, error_retries=error_retries, requeues=requeues)
            self.runs.append(run)
            return run_concerns(run, concerns, lambda ctx: work(run, ctx, self.attempts))

        self.task: Task = app.task(bind=True, name=f"test.scripted.{secrets.token_hex(4)}",
                                   shared=False, lazy=False)(body)


def _real_run(cache: DecoderCache) -> Callable[[TaskRun, JobContext], JobResult]:
    def work(run: TaskRun, ctx: JobContext) -> JobResult:
        return run_job(run.spec, cache, ctx)
    return work


def _real_run_work(cache: DecoderCache) -> Work:
    real = _real_run(cache)
    return lambda run, ctx, attempt: real(run, ctx)


def _apply(scripted: Scripted, job_id: str) -> Any:
    return scripted.task.apply(task_id=job_id)


def test_backoff_doubles_up_to_its_cap() -> None:
    s = Settings(retry_backoff_s=2.0, retry_backoff_max_s=10.0)
    assert [backoff(n, s) for n in range(5)] == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_retryable_error_spends_the_budget_then_fails(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a run that always hits a retryable error, and a budget of two retries
    spec = _spec(tmp_path, tenant)

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        raise StorageError(f"S3 503 on attempt {attempt}")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=2), work)
    # When the task runs
    result = _apply(scripted, spec.job_id)
    # Then it ran three times and failed with the last error
    assert scripted.attempts == 3
    assert result.state == "FAILURE"
    assert isinstance(result.result, StorageError) and "attempt 3" in str(result.result)
    assert _counts(tenant) == {"success": 0, "failure": 1, "retry": 2, "cancelled": 0}


def test_a_retry_that_succeeds_returns_the_result(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    spec = _spec(tmp_path, tenant)
    real = _real_run(DecoderCache(torch.device("cpu")))

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        if attempt == 1:
            raise StorageError("connection reset")
        return real(run, ctx)

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=1), work)
    result = _apply(scripted, spec.job_id)
    assert result.state == "SUCCESS"
    assert JobResult.model_validate(result.result).manifest.frames == 13
    assert _counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}


def test_a_fatal_error_fails_at_once(app: Celery, tmp_path: Path, tenant: str) -> None:
    spec = _spec(tmp_path, tenant)

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        raise FatalJobError("input.uri: not a latents file")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=5), work)
    result = _apply(scripted, spec.job_id)
    assert scripted.attempts == 1
    assert result.state == "FAILURE" and "input.uri" in str(result.result)
    assert _counts(tenant)["failure"] == 1 and _counts(tenant)["retry"] == 0


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
    spec = _spec(tmp_path, tenant)
    settings = Settings(file_roots=str(tmp_path), retry_max=0)
    scripted = Scripted(app, spec, settings, _real_run_work(_Cache(fits_tiled)))
    # When the task runs with no retry budget at all
    result = _apply(scripted, spec.job_id)
    # Then it ran once more at once, tiled; a tiled OOM is fatal, naming both attempts
    assert scripted.attempts == 2
    assert [run.tiled for run in scripted.runs] == [False, True]
    if fits_tiled:
        assert result.state == "SUCCESS"
        assert _counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}
    else:
        assert result.state == "FAILURE"
        assert isinstance(result.result, FatalJobError)
        assert "the smaller working set did not fit either" in str(result.result)
        assert _counts(tenant) == {"success": 0, "failure": 1, "retry": 1, "cancelled": 0}


def test_cancel_before_start_is_revoked_and_runs_nothing(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    spec = _spec(tmp_path, tenant)
    flags_for(app).set_cancel(spec.job_id)

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        raise AssertionError("a cancelled job must not run")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path)), work)
    _apply(scripted, spec.job_id)
    meta = app.backend.get_task_meta(spec.job_id)
    assert meta["status"] == "REVOKED"
    assert "cancelled before it started" in str(meta["result"])
    assert _counts(tenant) == {"success": 0, "failure": 0, "retry": 0, "cancelled": 1}


def test_cancel_mid_run_is_polled_and_revoked(app: Celery, tmp_path: Path, tenant: str) -> None:
    spec = _spec(tmp_path, tenant)
    polls: list[bool] = []

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        polls.append(ctx.cancelled())
        run.flags.set_cancel(run.spec.job_id)
        polls.append(ctx.cancelled())
        raise JobCancelled(f"job {run.spec.job_id} was cancelled")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), cancel_poll_s=0), work)
    _apply(scripted, spec.job_id)
    assert polls == [False, True]
    assert scripted.attempts == 1
    assert app.backend.get_task_meta(spec.job_id)["status"] == "REVOKED"
    assert _counts(tenant)["cancelled"] == 1


@pytest.mark.parametrize("end", ["cancelled", "failed", "retried"])
def test_a_job_that_ends_without_its_video_ends_its_live_playlist(
    app: Celery, tmp_path: Path, tenant: str, end: str
) -> None:
    # Given a job of five segments whose first run stops after two were listed: cancelled,
    # failed for good (no retry budget), or retried (a budget of one)
    spec = _spec(tmp_path, tenant).model_copy(update={"video": VideoSpec(segment_frames=8)})
    np.save(tmp_path / "z.npy", np.zeros((16, 10, 4, 6), np.float32))
    playlist = tmp_path / "out" / tenant / spec.job_id / PLAYLIST
    cache = DecoderCache(torch.device("cpu"))
    seen: list[str] = []

    inodes: dict[str, int] = {}
    listing: list[int] = []  # entries of the playlist as each of the retry's segments lands

    def entries() -> list[str]:
        return re.findall(r"^segment-\d+\.mp4$", playlist.read_text(), re.M)

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        if attempt > 1:
            seen.append(playlist.read_text())  # what the retry finds
            inodes.update({n: (playlist.parent / n).stat().st_ino for n in entries()})
            watched = replace(ctx, segment_landed=lambda seg, p: listing.append(len(entries())))
            return run_job(run.spec, cache, watched)
        listed: list[int] = []
        stopping = replace(ctx, cancelled=lambda: len(listed) >= 2,
                           segment_landed=lambda seg, p: listed.append(seg.index))
        try:
            return run_job(run.spec, cache, stopping)
        except JobCancelled:
            if end == "cancelled":
                raise
            raise StorageError("S3 went away") from None

    retry_max = 1 if end == "retried" else 0
    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=retry_max), work)
    result = _apply(scripted, spec.job_id)
    text = playlist.read_text()
    names = re.findall(r"^segment-\d+\.mp4$", text, re.M)
    if end == "retried":
        # Then the retry found the playlist open, never listed less than it did, kept the
        # segments it listed (not uploaded again), and ended it once, complete
        assert scripted.attempts == 2 and "#EXT-X-ENDLIST" not in seen[0]
        kept = re.findall(r"^segment-\d+\.mp4$", seen[0], re.M)
        assert len(kept) >= 2 and min(listing) >= len(kept), (kept, listing)
        assert {n: (playlist.parent / n).stat().st_ino for n in kept} == inodes
        assert text.startswith(seen[0].split("#EXT-X-MAP", 1)[0])
        assert seen[0].split("#EXT-X-MAP", 1)[1] in text  # the same byte ranges
        assert len(names) == 5 and text.count("#EXT-X-ENDLIST") == 1
        manifest = json.loads((playlist.parent / "manifest.json").read_text())
        for seg in manifest["segments"]:
            data = (playlist.parent / f"segment-{seg['index']:05d}.mp4").read_bytes()
            assert hashlib.sha256(data).hexdigest() == seg["sha256"]
        assert result.state == "SUCCESS"
    else:
        # Then the playlist keeps the segments it listed and tells players it ended
        assert scripted.attempts == 1
        assert 2 <= len(names) < 5 and text.endswith("#EXT-X-ENDLIST\n"), text
        assert not (playlist.parent / "manifest.json").exists()
        if end == "cancelled":
            assert app.backend.get_task_meta(spec.job_id)["status"] == "REVOKED"
        else:
            assert result.state == "FAILURE" and "S3 went away" in str(result.result)


def test_a_run_that_never_decoded_leaves_the_playlist_alone(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given an open playlist another run of the job is writing, and a run that fails before
    # it decodes anything (its lease is held elsewhere, say)
    spec = _spec(tmp_path, tenant)
    playlist = tmp_path / "out" / tenant / spec.job_id / PLAYLIST
    playlist.parent.mkdir(parents=True)
    playlist.write_text("#EXTM3U\n")

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        raise FatalJobError("refused before the decode")

    result = _apply(Scripted(app, spec, Settings(file_roots=str(tmp_path)), work), spec.job_id)
    # Then the playlist is not ended by it
    assert playlist.read_text() == "#EXTM3U\n"
    assert result.state == "FAILURE"


def test_preemption_requeues_outside_the_budget(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given a node that is preempted while the job runs, and no retry budget at all
    spec = _spec(tmp_path, tenant)
    real = _real_run(DecoderCache(torch.device("cpu")))
    r = redis.Redis.from_url(redis_url)

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        if attempt == 1:
            run.flags.set_preempted(run.node)
            assert ctx.cancelled()
            raise JobCancelled("stopped between chunks")
        # The next delivery (another worker in a fleet; here the same, no longer flagged)
        r.delete(f"framefleet:preempted:{run.node}")
        return real(run, ctx)

    settings = Settings(file_roots=str(tmp_path), retry_max=0, cancel_poll_s=0)
    scripted = Scripted(app, spec, settings, work)
    # When the task runs
    result = _apply(scripted, spec.job_id)
    # Then the job went back to the queue (not REVOKED, not failed) and its next run succeeded
    assert scripted.attempts == 2
    assert result.state == "SUCCESS"
    assert _counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}


def test_progress_is_stored_throttled_and_the_last_always(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    spec = _spec(tmp_path, tenant)
    seen: list[Any] = []

    def stored() -> Any:
        meta = app.backend.get_task_meta(spec.job_id)
        return meta["status"], (meta["result"] or {}).get("frames_done")

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        ctx.progress(Progress(frames_done=1, frames_total=3, segments_done=0))
        seen.append(stored())
        ctx.progress(Progress(frames_done=2, frames_total=3, segments_done=0))  # too soon
        seen.append(stored())
        ctx.progress(Progress(frames_done=3, frames_total=3, segments_done=1))  # the last
        seen.append(stored())
        raise FatalJobError("stop here")

    _apply(Scripted(app, spec, Settings(file_roots=str(tmp_path)), work), spec.job_id)
    assert seen == [("PROGRESS", 1), ("PROGRESS", 1), ("PROGRESS", 3)]


def test_a_new_concern_plugs_in_and_cannot_break_the_outcome(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a concern added after the default ones, whose outcome hook fails
    spec = _spec(tmp_path, tenant)
    events: list[str] = []

    class Recorder(Concern):
        def before_run(self) -> None:
            events.append(f"before {self.run.spec.job_id}")
            self.run.progress_hooks.append(lambda p: events.append(f"progress {p.frames_done}"))

        def on_error(self, error: BaseException) -> Outcome | None:
            events.append(f"error {type(error).__name__}")  # only errors nobody decided
            return None

        def on_outcome(self, outcome: Outcome) -> None:
            events.append(f"outcome {outcome.status}")
            raise RuntimeError("webhook down")

    real = _real_run(DecoderCache(torch.device("cpu")))
    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path)),
                        lambda run, ctx, attempt: real(run, ctx), concerns=(*CONCERNS, Recorder))
    # When the job runs
    result = _apply(scripted, spec.job_id)
    # Then the concern saw the run, its progress and its end, and the job still succeeded
    assert result.state == "SUCCESS"
    assert events[0] == f"before {spec.job_id}"
    assert "progress 13" in events
    assert events[-1] == "outcome success"
    assert not any(e.startswith("error") for e in events)


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
        spec = _spec(tmp_path, tenant)
        # When it runs (eagerly, through Celery's retry)
        result = task.apply(args=[spec.model_dump(mode="json")], task_id=spec.job_id)
    finally:
        get_settings.cache_clear()
    # Then the job succeeded tiled, and the other app never got the task
    assert result.state == "SUCCESS", result.traceback
    assert JobResult.model_validate(result.result).manifest.job_id == spec.job_id
    assert task.name not in other.tasks
    assert _counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}


def test_requeues_do_not_spend_the_retry_budget(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a run requeued once (the OOM fallback), then always hitting a retryable error
    spec = _spec(tmp_path, tenant)

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        if attempt == 1:
            raise DeviceOutOfMemory("CUDA out of memory")
        raise StorageError(f"S3 503 on attempt {attempt}")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=2), work)
    # When the task runs
    result = _apply(scripted, spec.job_id)
    # Then the error still got the whole budget: the requeue, then one try and two retries
    assert scripted.attempts == 4
    assert [(r.requeues, r.error_retries) for r in scripted.runs] == [
        (0, 0), (1, 0), (1, 1), (1, 2)]
    assert result.state == "FAILURE" and "attempt 4" in str(result.result)


def test_requeues_have_a_cap_of_their_own(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given a node that is preempted on every run, and at most two requeues
    spec = _spec(tmp_path, tenant)
    nodes = set()

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        nodes.add(run.node)
        run.flags.set_preempted(run.node)
        assert ctx.cancelled()
        raise JobCancelled("stopped between chunks")

    settings = Settings(file_roots=str(tmp_path), max_requeues=2, cancel_poll_s=0)
    scripted = Scripted(app, spec, settings, work)
    try:
        result = _apply(scripted, spec.job_id)
    finally:
        redis.Redis.from_url(redis_url).delete(*(f"framefleet:preempted:{n}" for n in nodes))
    # Then the third requeue is refused: FAILURE naming the setting
    assert scripted.attempts == 3
    assert result.state == "FAILURE"
    assert isinstance(result.result, FatalJobError)
    assert "requeued 2 times (FRAMEFLEET_MAX_REQUEUES=2)" in str(result.result)


def test_lease_waits_are_requeues_not_retries(
    app: Celery, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the real task, whose lease is held elsewhere for three looks, then a run that
    # always hits a retryable error, and a budget of two retries
    waits, runs = [False, False, False], []
    monkeypatch.setattr(tasks.JobLease, "acquire", lambda self: waits.pop() if waits else True)

    def run_job(spec: JobSpec, decoders: Any, ctx: JobContext) -> JobResult:
        runs.append(spec.job_id)
        raise StorageError(f"S3 503 on run {len(runs)}")

    monkeypatch.setattr(tasks, "run_job", run_job)
    monkeypatch.setenv("FRAMEFLEET_RETRY_MAX", "2")
    get_settings.cache_clear()
    try:
        task = tasks.register(app)
        spec = _spec(tmp_path, tenant)
        result = task.apply(args=[spec.model_dump(mode="json")], task_id=spec.job_id)
    finally:
        get_settings.cache_clear()
    # Then the error got its whole budget after the three lease waits: one run, two retries
    assert len(runs) == 3, runs
    assert result.state == "FAILURE" and "run 3" in str(result.result)


def _lost_runs(app: Celery, job_id: str, nodes: list[str]) -> None:
    """Runs of ``job_id`` on ``nodes`` that started and whose worker died (never ended)."""
    flags = flags_for(app)
    for n, node in enumerate(nodes):
        flags.start_run(job_id, f"{node} {1000 + n} t{n}")


def test_a_job_that_lost_its_worker_too_often_fails_naming_the_node(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a job whose worker died under it three times, the last on gpu7@lost
    spec = _spec(tmp_path, tenant)
    _lost_runs(app, spec.job_id, ["gpu1@a", "gpu2@b", "gpu7@lost"])

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        raise AssertionError("a job over the cap must not run")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), max_worker_losses=3), work)
    # When it is delivered again
    result = _apply(scripted, spec.job_id)
    # Then it fails at once, saying so and naming the node, and is not retried
    assert result.state == "FAILURE"
    assert isinstance(result.result, FatalJobError)
    message = str(result.result)
    assert "lost 3 times" in message and "MAX_WORKER_LOSSES=3" in message
    assert "gpu7@lost" in message
    assert _counts(tenant) == {"success": 0, "failure": 1, "retry": 0, "cancelled": 0}


def test_a_job_under_the_loss_cap_runs_and_its_end_resets_the_count(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given a job whose worker died under it once
    spec = _spec(tmp_path, tenant)
    _lost_runs(app, spec.job_id, ["gpu1@a"])
    real = _real_run(DecoderCache(torch.device("cpu")))
    seen: list[dict[bytes, bytes]] = []
    r = redis.Redis.from_url(redis_url)
    key = f"framefleet:runs:{spec.job_id}"

    def work(run: TaskRun, ctx: JobContext, attempt: int) -> JobResult:
        seen.append(r.hgetall(key))
        return real(run, ctx)

    settings = Settings(file_roots=str(tmp_path), max_worker_losses=3)
    result = _apply(Scripted(app, spec, settings, work), spec.job_id)
    # Then it ran (recorded as running, one loss on gpu1@a), and its success cleared the count
    assert result.state == "SUCCESS"
    assert seen[0][b"losses"] == b"1" and seen[0][b"lost_on"].startswith(b"gpu1@a ")
    assert set(r.hgetall(key)) <= {b"started"}


def test_output_outside_the_fleet_prefix_fails_at_once_naming_the_field(
    app: Celery, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "_decoders", DecoderCache(torch.device("cpu")))
    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    spec = _spec(tmp_path, tenant)
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
