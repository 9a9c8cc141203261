"""Plain timing records the pipeline fills (metrics.py turns them into Prometheus series)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class PipelineStats:
    """Seconds per stage, summed over chunks; thread-safe ``add``."""

    decode_s: float = 0.0
    postprocess_s: float = 0.0
    d2h_s: float = 0.0
    encode_s: float = 0.0
    upload_s: float = 0.0
    backpressure_s: float = 0.0
    busy_s: float = 0.0
    window_s: float = 0.0
    chunks: int = 0
    frames: int = 0
    segments: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **seconds: float) -> None:
        with self._lock:
            for name, value in seconds.items():
                setattr(self, name, getattr(self, name) + value)

    @property
    def gpu_busy_ratio(self) -> float | None:
        """Compute-stream busy time over the decode window; None off the GPU."""
        return self.busy_s / self.window_s if self.window_s > 0 else None
