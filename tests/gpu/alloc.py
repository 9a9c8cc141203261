"""What a piece of GPU work took from the driver: the caching allocator's new segments (each a
cudaMalloc), with the Python frames that asked for them, so that a failed "no allocation"
check says where the allocation came from.

``python -m tests.gpu.alloc CASE`` replays the allocation check as it stood before it measured
what its name says (eager decoder, a warm job of 4 latent frames, then one of 12 with the latents
uploaded from the CPU), and the cases that tell its causes apart: ``old``; ``equal`` (the second
job also 4 frames); ``on-gpu`` (12 frames, latents already on the GPU). One case per process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Segments:
    """New segments while ``count`` ran: how many, bytes reserved after, and where from."""

    allocated: int = 0
    reserved_before: int = 0
    reserved_after: int = 0
    origins: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        where = "\n  ".join(self.origins) or "(no trace)"
        return (f"{self.allocated} new segment(s), reserved {self.reserved_before} → "
                f"{self.reserved_after} bytes; allocated by:\n  {where}")


def settle(job: Callable[[], None], limit: int = 4) -> int:
    """Run ``job`` until one run takes no new segment; how many runs that took. The caching
    allocator's small-block pool can need a run or two to settle (measured on an H200: the
    second of two equal eager jobs took one more 2 MB segment); a job that takes memory every
    time, ``limit`` times in a row, allocates per job and fails here."""
    for runs in range(1, limit + 1):
        if count(job).allocated == 0:
            return runs
    raise AssertionError(f"{limit} equal jobs in a row each took new segments")


def _frames(entry: dict[str, Any], limit: int = 6) -> str:
    ours = [f for f in entry.get("frames", []) if "/torch/" not in f.get("filename", "")]
    shown = " <- ".join(f"{f['name']} ({f['filename'].rsplit('/', 2)[-1]}:{f['line']})"
                        for f in ours[:limit])
    return f"{entry.get('size', 0)} bytes on stream {entry.get('stream')}: {shown}"


def count(work: Callable[[], None]) -> Segments:
    """Run ``work`` (then synchronise) with the allocator's history recorded."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=200_000)
    try:
        work()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    after = torch.cuda.memory_stats()
    traces = snapshot.get("device_traces", [[]])
    device = torch.cuda.current_device()
    events = traces[device] if device < len(traces) else []
    return Segments(
        allocated=after["segment.all.allocated"] - before["segment.all.allocated"],
        reserved_before=before["reserved_bytes.all.current"],
        reserved_after=after["reserved_bytes.all.current"],
        origins=[_frames(e) for e in events if e.get("action") == "segment_alloc"],
    )


def main(case: str) -> None:
    import json
    import tempfile
    from pathlib import Path

    from producer.wire.spec import PipelineSpec, VideoSpec
    from worker.decoders.wan import WanDecoder, build_vae
    from worker.pipeline import run_pipeline

    cuda = torch.device("cuda", 0)
    # The old test ran after test_gpu_fast_decode in one process: cuDNN's benchmark mode on.
    torch.backends.cudnn.benchmark = True
    decoder = WanDecoder(build_vae("wan2.1", dtype=torch.bfloat16), cuda)
    work = Path(tempfile.mkdtemp())

    def job(z: torch.Tensor, name: str) -> None:
        (work / name).mkdir()
        run_pipeline(decoder, z, video=VideoSpec(segment_frames=16), pipeline=PipelineSpec(),
                     scratch=work / name, sink=lambda s: None)

    job(torch.randn(16, 4, 30, 52), "warm")
    second = torch.randn(16, 4 if case == "equal" else 12, 30, 52)
    if case == "on-gpu":
        second = second.to(cuda, torch.bfloat16)
    got = count(lambda: job(second, "second"))
    print(json.dumps({"case": case, "new_segments": got.allocated,
                      "reserved_before": got.reserved_before,
                      "reserved_after": got.reserved_after, "origins": got.origins}))


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
