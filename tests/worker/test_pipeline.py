"""The pipeline on the CPU path: order, no loss, back-pressure, errors, cancellation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from producer.spec import PipelineSpec, VideoSpec
from worker.decoders.pattern import PatternDecoder, read_frame_index
from worker.encode import read_frames_rgb
from worker.pipeline import ClosedSegment, run_pipeline


def _indices(segments: list[ClosedSegment]) -> list[int]:
    out: list[int] = []
    for seg in sorted(segments, key=lambda s: s.index):
        frames = read_frames_rgb(seg.file.path)
        assert len(frames) == seg.file.frames
        out += [read_frame_index(f) for f in frames]
    return out


def _run(tmp: Path, mode: str, latent_frames: int = 11, slots: int = 3, seg: int = 10,
         sink_delay: float = 0.0, **kw: object) -> tuple[list[ClosedSegment], object]:
    segments: list[ClosedSegment] = []
    tmp.mkdir(parents=True, exist_ok=True)

    def sink(s: ClosedSegment) -> None:
        time.sleep(sink_delay)
        segments.append(s)

    report = run_pipeline(
        PatternDecoder(), torch.zeros(16, latent_frames, 6, 8),
        video=VideoSpec(segment_frames=seg), pipeline=PipelineSpec(mode=mode, ring_slots=slots),
        scratch=tmp, sink=sink, **kw,  # type: ignore[arg-type]
    )
    return segments, report


@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_every_frame_once_in_order(tmp_path: Path, mode: str) -> None:
    segments, report = _run(tmp_path, mode)
    assert report.frames == 41  # type: ignore[attr-defined]
    assert _indices(segments) == list(range(41))
    assert [s.first_frame for s in sorted(segments, key=lambda s: s.index)] == [0, 10, 20, 30, 40]


def test_async_and_sequential_give_identical_frames(tmp_path: Path) -> None:
    a, _ = _run(tmp_path / "a", "async")
    b, _ = _run(tmp_path / "b", "sequential")
    fa = [f for s in sorted(a, key=lambda s: s.index) for f in read_frames_rgb(s.file.path)]
    fb = [f for s in sorted(b, key=lambda s: s.index) for f in read_frames_rgb(s.file.path)]
    assert len(fa) == len(fb) == 41
    assert all((x == y).all() for x, y in zip(fa, fb, strict=True))


def test_slow_writer_with_two_slots_loses_nothing(tmp_path: Path) -> None:
    # Given only two ring slots and a sink far slower than decoding (back-pressure)
    segments, report = _run(tmp_path, "async", latent_frames=16, slots=2, seg=4,
                            sink_delay=0.05)
    # Then the main thread waited for slots, and still every frame arrived exactly once
    assert report.stats.backpressure_s > 0  # type: ignore[attr-defined]
    assert _indices(segments) == list(range(61))


def test_sink_error_fails_the_job(tmp_path: Path) -> None:
    calls = []

    def sink(s: ClosedSegment) -> None:
        calls.append(s.index)
        if s.index == 1:
            raise OSError("disk full while uploading segment 1")

    with pytest.raises(OSError, match="segment 1"):
        run_pipeline(PatternDecoder(), torch.zeros(16, 21, 4, 4), video=VideoSpec(segment_frames=8),
                     pipeline=PipelineSpec(), scratch=tmp_path, sink=sink)
    assert 1 in calls
    # No worker thread is left behind.
    time.sleep(0.2)
    assert not [t for t in threading.enumerate() if t.name.startswith(("encode-", "framefleet-w"))]


def test_decoder_error_propagates(tmp_path: Path) -> None:
    class Broken(PatternDecoder):
        def stream(self, latents: torch.Tensor):  # type: ignore[no-untyped-def]
            yield from list(super().stream(latents))[:2]
            raise RuntimeError("kernel launch failure")

    with pytest.raises(RuntimeError, match="kernel launch"):
        run_pipeline(Broken(), torch.zeros(16, 5, 4, 4), video=VideoSpec(),
                     pipeline=PipelineSpec(), scratch=tmp_path, sink=lambda s: None)


@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_cancel_stops_between_chunks(tmp_path: Path, mode: str) -> None:
    seen: list[int] = []

    def progress(done: int, total: int, segs: int) -> None:
        seen.append(done)

    _, report = _run(tmp_path, mode, latent_frames=30, seg=8,
                            cancelled=lambda: len(seen) >= 3, progress=progress)
    assert report.cancelled  # type: ignore[attr-defined]
    assert max(seen) < 117
