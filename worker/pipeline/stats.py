"""Plain timing records the pipeline fills (metrics.py turns them into Prometheus series)."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

from producer.wire.spec import STAGE_NAMES, check_stage_fields

#: Stages the runner times, not the pipeline: loading the latents, or generating them (and the
#: previews made while denoising, timed by their writer).
BEFORE_PIPELINE = ("load", "adapter_load", "text_encode", "denoise", "preview")
#: The stages the pipeline measures: every other stage.
PIPELINE_STAGES = tuple(s for s in STAGE_NAMES if s not in BEFORE_PIPELINE)


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
    #: From the last chunk's planes on the host to the last segment through the sink: the
    #: part of the job that no decoding overlaps (the job's tail).
    tail_s: float = 0.0
    chunks: int = 0
    frames: int = 0
    segments: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **seconds: float) -> None:
        with self._lock:
            for name, value in seconds.items():
                setattr(self, name, getattr(self, name) + value)

    def stage_seconds(self) -> dict[str, float]:
        """``{stage}_s`` of every pipeline stage: the StageTimings fields these stats fill."""
        with self._lock:
            return {f"{s}_s": getattr(self, f"{s}_s") for s in PIPELINE_STAGES}

    @property
    def gpu_busy_ratio(self) -> float | None:
        """Compute-stream busy time over the decode window; None off the GPU."""
        return self.busy_s / self.window_s if self.window_s > 0 else None


check_stage_fields((f.name for f in dataclasses.fields(PipelineStats)), "PipelineStats",
                   skip=BEFORE_PIPELINE)
