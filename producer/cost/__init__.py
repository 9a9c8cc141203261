"""The cost model: what a job and the fleet cost to serve.

- ``pricing``: the dated price catalog, its override file, the prices one worker pays;
- ``model``: the direct cost of one job (GPU time, S3 requests, storage; per stage);
- ``fleet``: per-tenant totals and the utilisation-adjusted cost over many jobs;
- ``tables``: the tables ``framefleet cost report`` prints.

Pure functions over the wire format's records; no Redis, no Celery.
"""

from producer.cost.model import (
    BYTES_PER_GB,
    COST_STAGES,
    SECONDS_PER_HOUR,
    configured_prices,
    cost_for_job,
    gpu_usd_per_second,
    job_cost,
    with_denoise,
    with_stages,
)

__all__ = [
    "BYTES_PER_GB",
    "COST_STAGES",
    "SECONDS_PER_HOUR",
    "configured_prices",
    "cost_for_job",
    "gpu_usd_per_second",
    "job_cost",
    "with_denoise",
    "with_stages",
]
