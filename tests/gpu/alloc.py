"""What a piece of GPU work took from the driver: the caching allocator's new segments (each a
cudaMalloc), with the Python frames that asked for them, so that a failed "no allocation"
check says where the allocation came from."""

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
