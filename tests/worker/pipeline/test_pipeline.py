"""The pipeline on the CPU path: order, no loss, back-pressure, errors, cancellation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from producer.errors import InvalidJobError
from producer.wire.spec import PipelineSpec, VideoSpec
from worker.decoders.pattern import PatternDecoder, read_frame_index
from worker.pipeline import ClosedSegment, PipelineStats, run_pipeline
from worker.pipeline.encode import read_frames_rgb
from worker.pipeline.stats import PIPELINE_STAGES


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
    assert not [t for t in threading.enumerate()
                if t.name.startswith(("encode-", "framefleet-writer"))]


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


@pytest.mark.parametrize(("shape", "message"), [
    ((16, 3, 4), r"\(C, T, h, w\).*\(16, 3, 4\)"),
    ((4, 3, 4, 4), "4 latent channels, decoder pattern expects 16"),
    ((16, 0, 4, 4), "empty latents"),
])
@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_latents_that_do_not_fit_are_refused_before_any_work(
    tmp_path: Path, mode: str, shape: tuple[int, ...], message: str
) -> None:
    class Counting(PatternDecoder):
        chunks = 0

        def stream(self, latents: torch.Tensor):  # type: ignore[no-untyped-def]
            for chunk in super().stream(latents):
                Counting.chunks += 1
                yield chunk

    with pytest.raises(InvalidJobError, match=message):
        run_pipeline(Counting(), torch.zeros(shape), video=VideoSpec(),
                     pipeline=PipelineSpec(mode=mode), scratch=tmp_path, sink=lambda s: None)
    assert Counting.chunks == 0 and list(tmp_path.iterdir()) == []


def test_odd_frame_sizes_are_refused_by_name(tmp_path: Path) -> None:
    class Odd(PatternDecoder):
        def output_size(self, latent_h: int, latent_w: int) -> tuple[int, int]:
            return latent_h * 8 + 1, latent_w * 8

    with pytest.raises(InvalidJobError, match="32x33 frames; yuv420p needs even sizes"):
        run_pipeline(Odd(), torch.zeros(16, 2, 4, 4), video=VideoSpec(),
                     pipeline=PipelineSpec(), scratch=tmp_path, sink=lambda s: None)


def test_a_decoder_error_that_mentions_a_size_is_not_called_bad_input(tmp_path: Path) -> None:
    # Latents that fit pass the shape check; a later error is the decoder's own, unchanged
    class Broken(PatternDecoder):
        def stream(self, latents: torch.Tensor):  # type: ignore[no-untyped-def]
            yield from list(super().stream(latents))[:1]
            raise RuntimeError("Expected size 4 but got size 3 (a bug in the model)")

    with pytest.raises(RuntimeError, match="a bug in the model") as info:
        run_pipeline(Broken(), torch.zeros(16, 3, 4, 4), video=VideoSpec(),
                     pipeline=PipelineSpec(), scratch=tmp_path, sink=lambda s: None)
    assert not isinstance(info.value, InvalidJobError)


def test_pipeline_stats_fill_every_stage_but_load(tmp_path: Path) -> None:
    _, report = _run(tmp_path, "async")
    stats: PipelineStats = report.stats  # type: ignore[attr-defined]
    assert PIPELINE_STAGES == ("decode", "postprocess", "d2h", "encode", "upload")
    seconds = stats.stage_seconds()
    assert list(seconds) == [f"{s}_s" for s in PIPELINE_STAGES]
    # the CPU path times decode, post-process and encode; there is no copy to time
    assert all(seconds[f"{s}_s"] > 0 for s in ("decode", "postprocess", "encode"))
    assert seconds["d2h_s"] == 0.0 and stats.gpu_busy_ratio is None


@pytest.mark.parametrize(("total", "first", "tail", "starts"), [
    (81, None, None, [0, 48]),
    (81, None, (77, 1), [0, 48]),  # one part: the plain layout
    (81, None, (77, 2), [0, 48, 77, 79]),
    (81, None, (77, 4), [0, 48, 77, 78, 79, 80]),
    (37, 3, None, [0, 3, 15, 27]),
    (37, 3, (33, 4), [0, 3, 15, 27, 33, 34, 35, 36]),
    (96, None, (92, 4), [0, 48, 92, 93, 94, 95]),  # a plain boundary inside the tail goes
    (5, None, (1, 8), [0, 1, 2, 3, 4]),  # never more parts than frames
    (1, None, (0, 4), [0]),  # a one-chunk job has no tail to split
])
def test_segment_plan(total: int, first: int | None, tail: tuple[int, int] | None,
                      starts: list[int]) -> None:
    from worker.pipeline.segments import segment_starts

    video = VideoSpec(segment_frames=48 if first is None else 12, first_segment_frames=first)
    assert segment_starts(total, video, tail) == starts


@pytest.mark.parametrize("mode", ["async", "sequential"])
@pytest.mark.parametrize("parts", [2, 4])
def test_last_chunk_in_segments_of_its_own(tmp_path: Path, mode: str, parts: int) -> None:
    # Given a 41-frame job (last chunk: frames 37-40) whose tail is split in ``parts``
    segments, report = _run(tmp_path, mode, tail_parts=parts)
    ordered = sorted(segments, key=lambda s: s.index)
    # Then every frame arrives once, in order, the last chunk's frames in their own segments
    assert _indices(segments) == list(range(41))
    tail = [37 + 4 * i // parts for i in range(parts)]
    assert [s.first_frame for s in ordered] == [0, 10, 20, 30, *tail]
    assert [s.last for s in ordered] == [False] * (len(ordered) - 1) + [True]
    assert report.stats.tail_s > 0  # type: ignore[attr-defined]


def test_cancel_after_the_tail_encoders_opened_leaves_no_thread(tmp_path: Path) -> None:
    seen: list[int] = []
    _, report = _run(tmp_path, "async", latent_frames=11, seg=10, tail_parts=4,
                     cancelled=lambda: len(seen) >= 10, progress=lambda d, t, s: seen.append(d))
    assert report.cancelled  # type: ignore[attr-defined]
    time.sleep(0.2)
    assert not [t for t in threading.enumerate()
                if t.name.startswith(("encode-", "framefleet-writer"))]


def test_a_decoder_that_stops_short_fails_the_job(tmp_path: Path) -> None:
    class Short(PatternDecoder):
        def stream(self, latents: torch.Tensor):  # type: ignore[no-untyped-def]
            yield from list(super().stream(latents))[:-1]

    with pytest.raises(RuntimeError, match="37 of 41 frames arrived"):
        run_pipeline(Short(), torch.zeros(16, 11, 4, 4), video=VideoSpec(segment_frames=10),
                     pipeline=PipelineSpec(), scratch=tmp_path, sink=lambda s: None,
                     tail_parts=4)
    # the tail's encoders, opened ahead, left no files
    assert not [p for p in tmp_path.glob("*.mp4") if p.name >= "segment-00004.mp4"]
