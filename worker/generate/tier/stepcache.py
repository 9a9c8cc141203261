"""Step caches for one job: diffusers' own, through ``transformer.enable_cache(...)``.

The spec names the cache and its parameters (``producer.wire.generation``); this turns them into
diffusers' ``FirstBlockCacheConfig``, ``TaylorSeerCacheConfig`` or ``MagCacheConfig``, enables
it on the job's transformers for the denoise only, and always disables it afterwards (also when
the job fails or is cancelled), with the hooks' state reset: the resident model a later job
gets has no hook and no state left. A job that asked for no cache never gets one.

Every cache here hooks whole blocks, around their compiled ``forward``
(``worker.generate.tier.tiers``), so a cached job keeps the compiled blocks. TaylorSeer therefore
runs in diffusers' lite mode (whole blocks skipped, the output projection predicted): its full mode
hooks modules whose names fully match ``blocks.*attn``, and Wan's are ``attn1``/``attn2``, so on Wan
it would hook nothing and cache nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from producer.errors import InvalidJobError
from producer.wire.generation import CacheSpec, FirstBlockCache, MagCache, TaylorSeerCache
from worker.generate.tier.tiers import transformers_of


def check_cache(cache: CacheSpec | None, experts: int) -> None:
    """What depends on the model: a MagCache is calibrated on one transformer."""
    if isinstance(cache, MagCache) and experts > 1:
        raise InvalidJobError(
            "generate.cache: a MagCache's ratios are calibrated on one transformer; this "
            "model has two experts (use first_block or taylorseer)")


def diffusers_config(cache: CacheSpec, steps: int) -> Any:
    """The diffusers config object for ``cache`` (a new one per transformer: they hold state)."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if isinstance(cache, FirstBlockCache):
        return FirstBlockCacheConfig(threshold=cache.threshold)
    if isinstance(cache, TaylorSeerCache):
        return TaylorSeerCacheConfig(
            cache_interval=cache.cache_interval,
            disable_cache_before_step=cache.disable_cache_before_step,
            disable_cache_after_step=cache.disable_cache_after_step,
            max_order=cache.max_order, use_lite_mode=True,
        )
    return MagCacheConfig(
        threshold=cache.threshold, max_skip_steps=cache.max_skip_steps,
        retention_ratio=cache.retention_ratio, num_inference_steps=steps,
        mag_ratios=list(cache.mag_ratios),
    )


def _off(model: Any) -> None:
    if model.is_cache_enabled:
        model.disable_cache()
    model._reset_stateful_cache()


@contextmanager
def step_cache(pipe: Any, cache: CacheSpec | None, steps: int) -> Iterator[None]:
    """``cache`` enabled on ``pipe``'s transformers for the block's duration (none: nothing)."""
    if cache is None:
        yield
        return
    models = transformers_of(pipe)
    for model in models:  # a hook left behind by a crashed job must not stack with this one
        _off(model)
    try:
        for model in models:
            model.enable_cache(diffusers_config(cache, steps))
        yield
    finally:
        for model in models:
            _off(model)
