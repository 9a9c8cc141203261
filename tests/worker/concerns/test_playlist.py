"""EndPlaylist: a job that ends without its video ends its live playlist; a retry keeps it."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from celery import Celery

from producer.errors import FatalJobError, JobCancelled, StorageError
from producer.settings import Settings
from producer.spec import JobResult, VideoSpec
from tests.worker.concerns.scripted import Scripted, job_spec
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


def test_a_run_that_never_decoded_leaves_the_playlist_alone(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given an open playlist another run of the job is writing, and a run that fails before
    # it decodes anything (its lease is held elsewhere, say)
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
