"""The tier stage: how one job's denoise runs on the resident model, entered once around it.

:func:`job_stance` holds, for the denoise's duration, the compiled-or-eager stance of the job's
size (``worker.generate.tier.tiers.size_stance``), its step cache (``stepcache``), and its LoRA
adapters switched on (``worker.generate.conditions.read.adapters_on``). No background build
runs meanwhile: the job owns the device (``worker.owner``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from producer.wire.spec import GenerateSpec
from worker.generate.conditions.read import Conditions, adapters_on
from worker.generate.model.cache import ModelCache, Resident
from worker.generate.request.folder import ModelInfo
from worker.generate.tier.stepcache import step_cache
from worker.generate.tier.tiers import size_stance, transformers_of


@contextmanager
def job_stance(models: ModelCache, entry: Resident, info: ModelInfo, gen: GenerateSpec,
               cond: Conditions) -> Iterator[bool]:
    """Yields whether the transformer runs compiled for this job."""
    # image channels (Wan I2V 14B) change the transformer's inputs: its own compiled size
    size = (gen.num_frames, gen.height, gen.width, info.image_input if cond.i2v else "text")
    adapters_loaded = entry.adapters is not None and entry.adapters.any()
    with size_stance(entry.sizes, entry.compiled, size, models.compiled_sizes,
                                   eager=adapters_loaded,
                                   transformers=tuple(transformers_of(entry.pipe))) as compiled, \
            step_cache(entry.pipe, gen.cache, gen.num_inference_steps), adapters_on(entry, cond):
        yield compiled
