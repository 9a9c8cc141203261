"""The asynchronous frame pipeline (DESIGN §4). No Celery, boto3 or Prometheus in here."""

from worker.pipeline.engine import PipelineReport, run_pipeline
from worker.pipeline.segments import ClosedSegment, SegmentSink
from worker.pipeline.stats import PipelineStats

__all__ = ["ClosedSegment", "PipelineReport", "PipelineStats", "SegmentSink", "run_pipeline"]
