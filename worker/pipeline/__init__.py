"""The asynchronous frame pipeline: latents in, MP4 segments out, the GPU never waiting on
the encoder.

``run_pipeline`` (``engine``) drives one job's chunks: the decoder and the yuv420p post-process
(``postprocess``) on the compute stream, each chunk's device-to-host copy on the copy stream
into a pinned slot of the ``ring`` (``hostcopy``: the copy, its events and its one blocking
wait), the ``writer`` thread that waits for each slot and feeds the ``segments`` encoders, and
the sink that uploads each closed segment. ``launch`` holds what differs between CUDA and the
CPU; ``stats`` the plain timing records; ``threads`` the one thread shape they share.

No Celery, boto3 or Prometheus in here: progress, cancellation and the sink are plain
callables the caller passes in.
"""

from worker.pipeline.engine import PipelineReport, run_pipeline
from worker.pipeline.segments import ClosedSegment, SegmentSink
from worker.pipeline.stats import PipelineStats

__all__ = ["ClosedSegment", "PipelineReport", "PipelineStats", "SegmentSink", "run_pipeline"]
