"""Watch while it renders: headless Chromium with hls.js plays a job's playlist mid-job.

A paced pattern job (each chunk takes at least ``CHUNK_S``) writes into a ``file://`` output
folder that a loopback web server serves. The browser is started once the first segment is
listed, while the job still runs; it plays the EVENT playlist as it grows, until ENDLIST and
the end of the stream, and reports the frame index read from every frame it presented.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from producer.wire.spec import DecoderSpec, InputSpec, JobResult, JobSpec, OutputSpec, VideoSpec
from tests.e2e.hls_player import CHROMIUM_INSTALL, HLS_JS, HLS_JS_INSTALL, Chromium, PlayerServer
from tests.require import missing, require_binary
from worker.decoders.base import ChunkDecoder
from worker.decoders.pattern import PatternDecoder
from worker.run import DecoderCache, run_job
from worker.sinks.hls import PLAYLIST

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("file_roots")]

CHUNK_S = 0.12  # four frames per chunk: ~33 frames/s, faster than playback (16 fps)
LATENT_FRAMES = 40  # 157 frames, ~10 s of video
FPS = 16.0


class PacedPattern(PatternDecoder):
    """The pattern decoder, no faster than ``chunk_s`` per chunk: a job that is still running
    while the browser opens its stream."""

    def __init__(self, chunk_s: float) -> None:
        super().__init__("cpu")
        self.chunk_s = chunk_s

    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        for chunk in super().stream(latents):
            time.sleep(self.chunk_s)
            yield chunk


class PacedCache(DecoderCache):
    def __init__(self, chunk_s: float) -> None:
        super().__init__(torch.device("cpu"))
        self.chunk_s = chunk_s

    def _build(self, spec: DecoderSpec) -> ChunkDecoder:
        return PacedPattern(self.chunk_s)


def test_chromium_plays_the_stream_while_the_job_runs(tmp_path: Path) -> None:
    browser = require_binary("chromium", CHROMIUM_INSTALL)
    if not HLS_JS.is_file():
        missing("hls.js", HLS_JS_INSTALL)
    np.save(tmp_path / "z.npy", np.zeros((16, LATENT_FRAMES, 24, 32), np.float32))
    spec = JobSpec(
        job_id="live-1", input=InputSpec(uri=(tmp_path / "z.npy").as_uri()),
        decoder=DecoderSpec(name="pattern"),
        video=VideoSpec(fps=FPS, segment_frames=16, first_segment_frames=4),
        output=OutputSpec(uri=(tmp_path / "out").as_uri()),
    )
    folder = tmp_path / "out" / spec.tenant / spec.job_id
    outcome: dict[str, JobResult | BaseException | float] = {}

    def run() -> None:
        try:
            outcome["result"] = run_job(spec, PacedCache(CHUNK_S))
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread below
            outcome["error"] = e
        outcome["ended_at"] = time.monotonic()

    job = threading.Thread(target=run, daemon=True)
    job.start()
    deadline = time.monotonic() + 30
    while not (folder / PLAYLIST).is_file():
        assert job.is_alive() and time.monotonic() < deadline, f"no playlist: {outcome}"
        time.sleep(0.02)
    with PlayerServer(folder, PLAYLIST) as server:
        chromium = Chromium(browser, tmp_path / "chromium", server.url)
        chromium.start()
        try:
            reported = server.reported.wait(timeout=90)
        finally:
            chromium.stop()
        job.join(timeout=30)
    assert "error" not in outcome, outcome
    result = outcome["result"]
    assert isinstance(result, JobResult)
    assert reported, f"the page reported nothing; chromium log:\n{chromium.log_text()[-3000:]}"
    report = server.report
    assert report is not None
    # Given the browser opened the playlist while the job was still running
    first_at, first_text = server.playlist_fetches[0]
    assert "#EXT-X-ENDLIST" not in first_text
    assert first_at < float(outcome["ended_at"])  # type: ignore[arg-type]
    # and the playlist grew under it, then ended
    assert "#EXT-X-ENDLIST" in server.playlist_fetches[-1][1]
    assert len({text for _, text in server.playlist_fetches}) > 2
    # Then it played to the end without a fatal error,
    assert report["reason"] == "ended", report
    assert not [e for e in report["errors"] if e.get("fatal")], report["errors"]
    # reading init sections and media by byte range out of the segment files,
    assert any(r.startswith("segment-00000.mp4 0-") for r in server.ranges), server.ranges
    # and showed the frame indices in order, each once, from the first to the last: a frame
    # the page got no callback for must be one the browser counted, as presented
    # (requestVideoFrameCallback skips callbacks on a busy machine; presentedFrames counts
    # them) or as dropped (its compositor drops a late frame: droppedVideoFrames). The last
    # entry, read at "ended", has no presented count: it follows the one before, or the
    # frames dropped since.
    entries = report["seen"]
    seen = [s["index"] for s in entries]
    assert seen[0] == 0 and seen[-1] == result.manifest.frames - 1, seen
    for before, after in pairwise(entries):
        shown = 1 if after["presented"] is None else after["presented"] - before["presented"]
        dropped = after["dropped"] - before["dropped"]
        assert 1 <= after["index"] - before["index"] <= shown + dropped, (before, after, seen)
    print(f"hls playback: {len(seen)} frames called back, "
          f"{entries[-1]['dropped']} dropped by the browser")
    assert result.manifest.playlist_uri == (folder / PLAYLIST).as_uri()
