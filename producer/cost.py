"""Cost-to-serve of one job, as a pure function of its usage and the prices it ran at.

Prices come from :mod:`producer.pricing` (the dated catalog and its override file); every
:class:`~producer.spec.CostReport` carries them with their sources. :func:`configured_prices`
and :func:`cost_for_job` are the worker's entry points: the prices of this process's settings.
"""

from __future__ import annotations

import functools
import math

from producer.pricing import load_catalog, prices_for
from producer.settings import get_settings
from producer.spec import CostReport, JobSpec, Prices

#: S3 bills storage per GB-month with GB = 2**30 bytes (AWS's billing unit).
BYTES_PER_GB = 2**30
SECONDS_PER_HOUR = 3600.0


def gpu_usd_per_second(prices: Prices) -> float:
    """What one GPU of this instance costs per second held."""
    return prices.instance_usd_per_hour / prices.gpus_per_instance / SECONDS_PER_HOUR


def job_cost(
    *,
    tenant: str,
    prices: Prices,
    gpu_seconds: float,
    s3_puts: int,
    stored_bytes: int,
    video_seconds: float,
) -> CostReport:
    """Direct cost-to-serve of one job.

    - GPU $ = gpu_seconds * instance $/h / GPUs per instance / 3600
    - S3 PUT $ = s3_puts * $ per 1000 PUT / 1000
    - storage $/month = stored_bytes / 2**30 * $/GB-month (S3's GB is 2**30 bytes)
    - total = GPU $ + PUT $ + ONE month of storage (outputs kept longer cost more per month)
    - $/video-minute = total / (video_seconds / 60); $ per 1000 h of video = the same rate
      scaled to 1000 hours of output video.

    Raises ``ValueError`` for negative inputs and for ``video_seconds <= 0`` (no rate).
    """
    for name, value in (
        ("gpu_seconds", gpu_seconds),
        ("s3_puts", s3_puts),
        ("stored_bytes", stored_bytes),
    ):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not math.isfinite(video_seconds) or video_seconds <= 0:
        raise ValueError(f"video_seconds must be > 0, got {video_seconds!r}")
    gpu_usd = gpu_seconds * gpu_usd_per_second(prices)
    put_usd = s3_puts * prices.s3_put_usd_per_1000 / 1000.0
    storage_usd = stored_bytes / BYTES_PER_GB * prices.s3_storage_usd_per_gb_month
    total = gpu_usd + put_usd + storage_usd
    per_video_second = total / video_seconds
    return CostReport(
        tenant=tenant,
        prices=prices,
        gpu_seconds=gpu_seconds,
        gpu_usd=gpu_usd,
        s3_puts=s3_puts,
        s3_put_usd=put_usd,
        stored_bytes=stored_bytes,
        storage_usd_per_month=storage_usd,
        total_usd=total,
        video_seconds=video_seconds,
        usd_per_video_minute=per_video_second * 60.0,
        usd_per_1000_video_hours=per_video_second * SECONDS_PER_HOUR * 1000.0,
    )


@functools.lru_cache(maxsize=1)
def configured_prices() -> Prices:
    """Prices for this process's FRAMEFLEET_INSTANCE_TYPE / _CAPACITY / _PRICING_FILE.

    Read once per process (``configured_prices.cache_clear()`` after changing settings), so a
    broken pricing file fails the first job loudly instead of every job silently.
    """
    settings = get_settings()
    catalog = load_catalog(settings.pricing_file)
    return prices_for(settings.instance_type, settings.capacity, catalog)


def cost_for_job(
    spec: JobSpec, gpu_seconds: float, s3_puts: int, stored_bytes: int, video_seconds: float
) -> CostReport:
    """:func:`job_cost` with the configured prices: the runner's ``CostFn``."""
    return job_cost(
        tenant=spec.tenant,
        prices=configured_prices(),
        gpu_seconds=gpu_seconds,
        s3_puts=s3_puts,
        stored_bytes=stored_bytes,
        video_seconds=video_seconds,
    )
