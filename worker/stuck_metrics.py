"""The stuck-job counter's former home: it lives in ``worker.metrics.stuck`` now (and
``worker.metrics`` re-exports it). Kept so that its callers' imports keep working."""

from worker.metrics.stuck import STUCK, observe_stuck

__all__ = ["STUCK", "observe_stuck"]
