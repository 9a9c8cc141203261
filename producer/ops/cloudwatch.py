"""The queue depth as a CloudWatch metric, the signal the GPU autoscaling group tracks.

One datum per queue and refresh: namespace ``Framefleet``, metric ``QueueDepth``, dimension
``Queue``. The fleet template's scaling policy divides it by the group's in-service GPUs.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

NAMESPACE = "Framefleet"
METRIC_NAME = "QueueDepth"


def cloudwatch_client() -> Any:
    """A boto3 CloudWatch client from the standard AWS configuration (region, role)."""
    import boto3

    return boto3.client("cloudwatch")


def put_queue_depth(client: Any, queue: str, depth: int) -> bool:
    """Put one ``QueueDepth`` datum for ``queue``; False (and a warning) when CloudWatch failed.

    A failed put is logged, not raised: the exporter keeps serving Prometheus regardless, and
    the next refresh puts a fresh value.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.put_metric_data(
            Namespace=NAMESPACE,
            MetricData=[
                {
                    "MetricName": METRIC_NAME,
                    "Dimensions": [{"Name": "Queue", "Value": queue}],
                    "Value": float(depth),
                    "Unit": "Count",
                }
            ],
        )
    except (BotoCoreError, ClientError) as e:
        log.warning("CloudWatch put_metric_data failed: %s", e)
        return False
    return True
