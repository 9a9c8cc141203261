"""The asynchronous frame pipeline: latents in, MP4 segments out, the GPU never waiting on
the encoder. No Celery, boto3 or Prometheus in here."""

from worker.pipeline.engine import PipelineReport, run_pipeline
from worker.pipeline.segments import ClosedSegment, SegmentSink
from worker.pipeline.stats import PipelineStats

__all__ = ["ClosedSegment", "PipelineReport", "PipelineStats", "SegmentSink", "run_pipeline"]
