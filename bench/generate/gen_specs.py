"""The jobs ``bench/generate/generate.py`` and its extra rows submit: one prompt, one seed, the
step cache of the ``cache`` tier."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from producer.wire.spec import GenerateSpec, JobSpec, OutputSpec, VideoSpec, check_id

PROMPT = "a red fox runs through deep snow at dawn, cinematic, detailed fur"
NEGATIVE = "blurry, low quality, static"
#: The step cache the ``cache`` tier runs, and the default the README recommends: TaylorSeer
#: (lite) refreshes every 4th step after 2 full ones; its skips do not depend on the weights.
RECOMMENDED_CACHE: dict[str, Any] = {"kind": "taylorseer", "cache_interval": 4,
                                     "disable_cache_before_step": 2, "max_order": 1}


def gen_spec(folder: Path, size: tuple[int, int, int], steps: int, tier: str,
             **extra: Any) -> GenerateSpec:
    h, w, f = size
    cache = RECOMMENDED_CACHE if tier.endswith("cache") else None
    return GenerateSpec(model=folder.as_uri(), prompt=PROMPT, negative_prompt=NEGATIVE, height=h,
                        width=w, num_frames=f, num_inference_steps=steps, guidance_scale=5.0,
                        seed=42, save_latents=True,
                        tier="fp8" if tier.startswith("fp8") else "exact", cache=cache, **extra)


def bench_id(*parts: object) -> str:
    """A valid job id (``[A-Za-z0-9._-]``, ``check_id``) from a benchmark's parts: every run of
    other characters becomes one ``-`` (the tier ``fp8+cache`` is ``fp8-cache`` in an id: ``+``
    is no id character, and JobSpec refused the fp8+cache row's id on the H200)."""
    return check_id(re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(map(str, parts))), "job_id")


def job(work: Path, name: str, gen: GenerateSpec, tag: str) -> JobSpec:
    return JobSpec(job_id=bench_id("bench", name, tag), generate=gen,
                   output=OutputSpec(uri=(work / "out").as_uri()), video=VideoSpec())
