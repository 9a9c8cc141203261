"""The CUDA path of the pipeline, on a real GPU (``pytest -m gpu``; skipped without CUDA)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from producer.wire.spec import PipelineSpec, VideoSpec
from tests.gpu import alloc
from worker.decoders.pattern import PatternDecoder, read_frame_index
from worker.decoders.wan import WanDecoder, build_vae
from worker.pipeline import ClosedSegment, run_pipeline
from worker.pipeline.encode import read_frames_rgb
from worker.pipeline.hostcopy import HostCopy
from worker.pipeline.launch import cuda_streams
from worker.pipeline.postprocess import rgb_to_yuv420, yuv420_shape

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda", 0)


def _collect(decoder, latents, tmp: Path, mode: str, slots: int = 3, sink_delay: float = 0.0,
             seg: int = 16) -> tuple[dict[int, torch.Tensor], list[ClosedSegment]]:  # type: ignore[no-untyped-def]
    frames: dict[int, torch.Tensor] = {}
    segments: list[ClosedSegment] = []
    tmp.mkdir(parents=True, exist_ok=True)

    def tap(first: int, planes: torch.Tensor) -> None:
        for j in range(planes.shape[0]):
            assert first + j not in frames, f"frame {first + j} delivered twice"
            frames[first + j] = planes[j].clone()

    def sink(s: ClosedSegment) -> None:
        time.sleep(sink_delay)
        segments.append(s)

    run_pipeline(decoder, latents, video=VideoSpec(segment_frames=seg),
                 pipeline=PipelineSpec(mode=mode, ring_slots=slots), scratch=tmp, sink=sink,
                 frame_tap=tap)
    return frames, segments


def test_host_copy_waits_for_the_post_process_and_times_the_chunk() -> None:
    # Given a slot's copy whose staging is written only after ~10 ms of compute-stream work
    compute, copy_stream = cuda_streams(CUDA)
    copy = HostCopy((4, 6, 8), CUDA, copy_stream)
    copy.staging.zero_()
    torch.cuda.synchronize()
    with torch.cuda.stream(compute):
        copy.mark_start()
        torch.cuda._sleep(20_000_000)  # stands in for the decode: GPU busy, nothing written
        copy.mark_decoded()
        copy.staging[:3].fill_(7)  # stands in for the post-process
        copy.issue(3)
    # When the writer waits for it
    planes = copy.wait()
    # Then the pinned host planes hold what the compute stream wrote (the copy waited for it)
    assert planes.shape == (3, 6, 8) and planes.is_pinned()
    assert bool((planes == 7).all())
    seconds = copy.seconds()
    assert set(seconds) == {"decode_s", "postprocess_s", "d2h_s", "busy_s"}
    assert seconds["decode_s"] > 1e-3 and seconds["busy_s"] >= seconds["decode_s"]
    assert seconds["d2h_s"] >= 0


def test_async_and_sequential_identical_uint8_frames(tmp_path: Path) -> None:
    # Given the Wan architecture in bf16 on the GPU and random latents (deterministic kernels,
    # so that the two runs decode the same values)
    torch.backends.cudnn.deterministic = True
    decoder = WanDecoder(build_vae("wan2.1", seed=0, dtype=torch.bfloat16), CUDA)
    z = torch.randn(16, 6, 30, 52, generator=torch.Generator().manual_seed(0))
    # When the async (streams, events, pinned ring) and the sequential pipeline run it
    a, _ = _collect(decoder, z, tmp_path / "a", "async")
    b, _ = _collect(decoder, z, tmp_path / "b", "sequential")
    # Then the raw yuv420p frames handed to the encoder are bit-identical
    assert sorted(a) == sorted(b) == list(range(21))
    for k in a:
        assert torch.equal(a[k], b[k]), f"frame {k} differs"


def test_slow_writer_two_slots_never_sees_an_overwritten_slot(tmp_path: Path) -> None:
    # Given two ring slots and a writer much slower than the GPU
    h, w = 60, 104
    z = torch.zeros(16, 25, h, w)
    frames, segments = _collect(PatternDecoder(CUDA), z, tmp_path, "async", slots=2,
                                sink_delay=0.1, seg=8)
    # Then every frame equals the CPU-computed pattern exactly: no slot was overwritten early
    expected_src = list(PatternDecoder("cpu").stream(z))
    index = 0
    for chunk in expected_src:
        n = chunk.shape[1]
        planes = torch.empty(yuv420_shape(n, 8 * h, 8 * w), dtype=torch.uint8)
        rgb_to_yuv420(chunk, planes)
        for j in range(n):
            assert torch.equal(frames[index], planes[j]), f"frame {index} corrupted"
            index += 1
    assert index == 97 == len(frames)
    assert len(segments) == 13


def test_pattern_round_trip_through_mp4_on_gpu(tmp_path: Path) -> None:
    _, segments = _collect(PatternDecoder(CUDA), torch.zeros(16, 21, 60, 104), tmp_path,
                           "async", seg=20)
    got = []
    for seg in sorted(segments, key=lambda s: s.index):
        got += [read_frame_index(f) for f in read_frames_rgb(seg.file.path)]
    assert got == list(range(81))


def test_wan_bf16_matches_fp32_on_gpu() -> None:
    # Tolerance: relative L2 < 3e-2 over the clip. bf16 keeps 8 mantissa bits through ~30
    # convolutions of a randomly initialised VAE; measured 1.76e-2 on an H200 (2026-11-29).
    z = torch.randn(16, 5, 30, 52, generator=torch.Generator().manual_seed(1))
    ref = torch.cat(list(WanDecoder(build_vae("wan2.1", dtype=torch.float32), CUDA).stream(z)),
                    dim=1).float()
    half = torch.cat(list(WanDecoder(build_vae("wan2.1", dtype=torch.bfloat16), CUDA).stream(z)),
                     dim=1).float()
    rel = float((half - ref).norm() / ref.norm())
    print(f"bf16 vs fp32 relative L2: {rel:.2e}")
    assert rel < 3e-2


def test_no_allocation_per_chunk(tmp_path: Path) -> None:
    # Given the eager decoder (a worker's path while a size has no graph yet) and latents
    # already on the GPU in the decoder's dtype, as a generate job hands them over: they are
    # the job's input, allocated before the jobs (a block they took later would be missed by
    # the next job's ring: seen on an H200), and not what is counted here.
    decoder = WanDecoder(build_vae("wan2.1", dtype=torch.bfloat16, device=CUDA), CUDA)
    g = torch.Generator(device=CUDA).manual_seed(0)
    short = torch.randn(16, 6, 30, 52, device=CUDA, dtype=torch.bfloat16, generator=g)
    long = torch.randn(16, 24, 30, 52, device=CUDA, dtype=torch.bfloat16, generator=g)
    seg = 1 + 4 * 23  # one MP4 segment for either length: the same pipeline work around it
    runs = iter(range(100))
    # When equal-size jobs run until one takes nothing new (the allocator settles), then a job
    # of four times the chunks
    settled = alloc.settle(lambda: _collect(decoder, short, tmp_path / f"s{next(runs)}",
                                            "async", seg=seg))
    longer = alloc.count(lambda: _collect(decoder, long, tmp_path / "long", "async", seg=seg))
    # Then the equal jobs settled, and the longer one takes no memory from the driver: ring
    # slots, copies, events and the decoder's working set are reused whatever the chunk count
    print(f"equal jobs settled after {settled} run(s)")
    assert longer.allocated == 0 and longer.reserved_after == longer.reserved_before, \
        str(longer)
