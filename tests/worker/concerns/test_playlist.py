"""EndPlaylist: a job that ends without its video ends its live playlist; a retry keeps it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from celery import Celery

from producer.errors import FatalJobError, JobCancelled, StorageError
from producer.settings import Settings
from producer.state import keys
from producer.wire.spec import JobResult, JobSpec, VideoSpec
from tests.worker.concerns.scripted import Scripted, job_spec
from worker.concerns.playlist import end_later, end_playlist
from worker.run import DecoderCache, Run, run_job
from worker.sinks.hls import PLAYLIST


@pytest.mark.parametrize("end", ["cancelled", "failed", "retried"])
def test_a_job_that_ends_without_its_video_ends_its_live_playlist(
    app: Celery, tmp_path: Path, tenant: str, end: str
) -> None:
    # Given a job of five segments whose first run stops after two were listed: cancelled,
    # failed for good (no retry budget), or retried (a budget of one)
    spec = job_spec(tmp_path, tenant).model_copy(update={"video": VideoSpec(segment_frames=8)})
    np.save(tmp_path / "z.npy", np.zeros((16, 10, 4, 6), np.float32))
    playlist = tmp_path / "out" / tenant / spec.job_id / PLAYLIST
    cache = DecoderCache(torch.device("cpu"))
    seen: list[str] = []

    inodes: dict[str, int] = {}
    listing: list[int] = []  # entries of the playlist as each of the retry's segments lands

    def entries() -> list[str]:
        return re.findall(r"^segment-\d+\.mp4$", playlist.read_text(), re.M)

    def work(run: Run, attempt: int) -> JobResult:
        if attempt > 1:
            seen.append(playlist.read_text())  # what the retry finds
            inodes.update({n: (playlist.parent / n).stat().st_ino for n in entries()})
            run.segment_hooks.append(lambda seg, p: listing.append(len(entries())))
            return run_job(run.spec, cache, run)
        listed: list[int] = []
        run.cancel_checks.append(lambda: len(listed) >= 2)
        run.segment_hooks.append(lambda seg, p: listed.append(seg.index))
        try:
            return run_job(run.spec, cache, run)
        except JobCancelled:
            if end == "cancelled":
                raise
            raise StorageError("S3 went away") from None

    retry_max = 1 if end == "retried" else 0
    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=retry_max), work)
    result = scripted.apply(spec.key)
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
            assert app.backend.get_task_meta(spec.key)["status"] == "REVOKED"
        else:
            assert result.state == "FAILURE" and "S3 went away" in str(result.result)


def test_a_run_that_never_decoded_leaves_a_playlist_of_another_spec_alone(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given an open playlist at the job's path that does not name the job's spec, and a run
    # that fails before it decodes anything
    spec = job_spec(tmp_path, tenant)
    playlist = tmp_path / "out" / tenant / spec.job_id / PLAYLIST
    playlist.parent.mkdir(parents=True)
    playlist.write_text("#EXTM3U\n")

    def work(run: Run, attempt: int) -> JobResult:
        raise FatalJobError("refused before the decode")

    result = Scripted(app, spec, Settings(file_roots=str(tmp_path)), work).apply(spec.key)
    # Then the playlist is not ended by it
    assert playlist.read_text() == "#EXTM3U\n"
    assert result.state == "FAILURE"


def _open_playlist(app: Celery, tmp_path: Path, tenant: str) -> tuple[JobSpec, Path, str]:
    """A job of 20 segments whose one run stopped once two were listed (its worker died, say):
    the playlist it leaves is open. Returns the spec, the playlist and its text."""
    spec = job_spec(tmp_path, tenant).model_copy(update={"video": VideoSpec(segment_frames=8)})
    # Long enough that the stop comes before the end, however late the encoders list segments
    np.save(tmp_path / "z.npy", np.zeros((16, 40, 4, 6), np.float32))
    cache = DecoderCache(torch.device("cpu"))
    run = Run(spec=spec, settings=Settings(file_roots=str(tmp_path)))
    listed: list[int] = []
    run.cancel_checks.append(lambda: len(listed) >= 2)
    run.segment_hooks.append(lambda seg, p: listed.append(seg.index))
    with pytest.raises(JobCancelled):
        run_job(spec, cache, run)
    playlist = tmp_path / "out" / tenant / spec.job_id / PLAYLIST
    text = playlist.read_text()
    assert "#EXT-X-ENDLIST" not in text and len(re.findall(r"^segment-", text, re.M)) >= 2
    return spec, playlist, text


@pytest.mark.parametrize("end", ["failed", "cancelled"])
def test_a_run_that_ends_before_its_decode_ends_the_playlist_an_earlier_run_left_open(
    app: Celery, tmp_path: Path, tenant: str, end: str
) -> None:
    # Given the open playlist of an earlier run of the spec (a worker died under it, say), and
    # a run of the same job that fails for good (or is cancelled) before it decodes anything
    spec, playlist, before = _open_playlist(app, tmp_path, tenant)

    def work(run: Run, attempt: int) -> JobResult:
        if end == "cancelled":
            raise JobCancelled("cancelled while loading")
        raise FatalJobError("its worker was lost 3 times (FRAMEFLEET_MAX_WORKER_LOSSES=3)")

    settings = Settings(file_roots=str(tmp_path))
    result = Scripted(app, spec, settings, work).apply(spec.key)
    # Then the playlist lists the same segments, and is ended once
    assert playlist.read_text() == before + "#EXT-X-ENDLIST\n"
    if end == "failed":
        assert result.state == "FAILURE"
    else:  # an eager task stores only the REVOKED state the concern writes itself
        assert app.backend.get_task_meta(spec.key)["status"] == "REVOKED"
    # and a second end adds nothing
    assert end_playlist(spec, settings) is None
    assert playlist.read_text().count("#EXT-X-ENDLIST") == 1


def test_no_playlist_is_made_for_a_job_that_never_had_one(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a job whose first run fails before any segment landed
    spec = job_spec(tmp_path, tenant)

    def work(run: Run, attempt: int) -> JobResult:
        raise FatalJobError("bad input")

    result = Scripted(app, spec, Settings(file_roots=str(tmp_path)), work).apply(spec.key)
    # Then no playlist is written (nor its folder)
    assert result.state == "FAILURE"
    assert not (tmp_path / "out" / tenant / spec.job_id).exists()


def test_end_later_waits_for_the_lease_and_ends_the_playlist_once(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given an open playlist, and the job's lease held by another run
    spec, playlist, before = _open_playlist(app, tmp_path, tenant)
    r = redis.Redis.from_url(redis_url)
    lease = keys.lease(spec.key)
    r.set(lease, f"other@host {os.getpid()} held", px=10_000)
    try:
        settings = Settings(file_roots=str(tmp_path))
        thread = end_later(spec, settings, r, "me@host", within_s=20)
        # While the other run holds it, the playlist stays open
        time.sleep(1.5)
        assert playlist.read_text() == before and thread.is_alive()
        # Once it lets the lease go, the playlist is ended, once
        r.delete(lease)
        thread.join(15)
        assert not thread.is_alive()
        assert playlist.read_text() == before + "#EXT-X-ENDLIST\n"
        assert r.get(lease) is None  # the closer's lease is released
    finally:
        r.delete(lease)
        r.close()


def test_end_later_gives_up_while_another_run_holds_the_lease(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given an open playlist whose job's lease another run keeps
    spec, playlist, before = _open_playlist(app, tmp_path, tenant)
    r = redis.Redis.from_url(redis_url)
    lease = keys.lease(spec.key)
    r.set(lease, f"other@host {os.getpid()} held", px=10_000)
    try:
        thread = end_later(spec, Settings(file_roots=str(tmp_path)), r, "me@host", within_s=2)
        thread.join(10)
        # Then it gave up, and the playlist that run writes is untouched
        assert not thread.is_alive() and playlist.read_text() == before
    finally:
        r.delete(lease)
        r.close()
