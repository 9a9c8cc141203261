"""Cost-to-serve of one job, as a pure function of its usage and the prices it ran at.

Prices come from :mod:`producer.cost.pricing` (the dated catalog and its override file); every
:class:`~producer.wire.spec.CostReport` carries them with their sources. :func:`configured_prices`
and :func:`cost_for_job` are the worker's entry points: the prices of this process's settings.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

from producer.cost.pricing import load_catalog, prices_for
from producer.settings import get_settings
from producer.wire.spec import CostReport, GenerateFacts, JobSpec, Prices, StageCost

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


#: The stages a CostReport splits a job into: GPU stages in job order, then S3.
#: ``adapter_load`` (LoRAs loaded), ``preview`` (previews made while denoising) and
#: ``upload_wait`` (the device held while it waited for the encode and upload: a full frame
#: ring, the tail after the last chunk; a slow link to the store shows here) are listed only
#: when a job spent time on them.
COST_STAGES = ("adapter_load", "text_encode", "denoise", "preview", "decode", "upload_wait",
               "s3")
#: The GPU stages a job names its seconds of; ``decode`` is the rest of the GPU time.
NAMED_STAGES = ("adapter_load", "text_encode", "denoise", "preview", "upload_wait")
#: Named stages listed only when a job spent time on them.
OPTIONAL_STAGES = ("adapter_load", "preview", "upload_wait")


def with_stages(report: CostReport, seconds: Mapping[str, float]) -> CostReport:
    """``report`` with its ``stages``: what each stage cost and its share of the total.

    ``seconds`` gives the GPU-seconds of ``text_encode`` and ``denoise`` (generate jobs; 0 or
    missing for decode jobs), and of ``adapter_load`` when LoRAs were loaded, ``preview``
    when previews were made and ``upload_wait`` when the device waited for the encode and
    upload (each listed only then). ``decode`` is the rest of the GPU time the job held:
    loading and decoding. GPU $ is split
    in proportion to seconds; ``s3`` is the PUT $ plus one month of storage. Shares add up to
    1 (0 when the total is 0). Raises ``ValueError`` for an unknown stage, a negative value,
    or named stages longer than the job's GPU time.
    """
    named = 0.0
    for stage, value in seconds.items():
        if stage not in NAMED_STAGES:
            raise ValueError(f"stage must be one of {NAMED_STAGES}, got {stage!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{stage} seconds must be a finite number >= 0, got {value!r}")
        named += value
    if named > report.gpu_seconds * (1 + 1e-9):
        raise ValueError(
            f"stage seconds ({named:.6f}) exceed the job's GPU seconds ({report.gpu_seconds:.6f})"
        )
    per_second = report.gpu_usd / report.gpu_seconds if report.gpu_seconds > 0 else 0.0
    gpu = {stage: float(seconds.get(stage, 0.0)) for stage in NAMED_STAGES}
    gpu["decode"] = max(0.0, report.gpu_seconds - named)
    usd = {stage: secs * per_second for stage, secs in gpu.items()}
    usd["s3"] = report.s3_put_usd + report.storage_usd_per_month
    total = sum(usd.values())
    stages = tuple(
        StageCost(stage=stage, gpu_seconds=gpu.get(stage, 0.0), usd=usd[stage],
                  share=usd[stage] / total if total > 0 else 0.0)
        for stage in COST_STAGES if stage not in OPTIONAL_STAGES or gpu[stage] > 0
    )
    return report.model_copy(update={"stages": stages})


def with_denoise(report: CostReport, facts: GenerateFacts, denoise_s: float) -> CostReport:
    """``report`` with a generate job's tier, step cache and GPU-seconds per denoise step."""
    per_step = denoise_s / facts.steps if facts.steps else None
    return report.model_copy(update={
        "tier": facts.tier, "cache": facts.cache, "denoise_steps": facts.steps,
        "gpu_seconds_per_denoise_step": per_step})


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
