"""MagCache calibration: diffusers' own calibrate mode on one model folder, on this host.

``python -m worker calibrate-magcache --model DIR --steps N`` runs one job's denoise with
``MagCacheConfig(calibrate=True)`` (no step skipped) and prints the ratios diffusers measured
as JSON: the ``mag_ratios`` a job's ``generate.cache`` passes. Ratios belong to a model and a
scheduler (flow shift); diffusers interpolates them to another step count.

diffusers reports the ratios through its logger at the end of the run (and then resets its
state); they are read from that record, so the numbers are diffusers' own.
"""

from __future__ import annotations

import ast
import logging
from typing import Any

import torch

from producer.settings import Settings
from producer.wire.spec import GenerateSpec
from worker.generate.conditions.text import encode_prompt
from worker.generate.denoise.loop import denoise
from worker.generate.model.cache import ModelCache
from worker.generate.request.folder import check_request, model_folder, read_model

PREFIX = "MagCache Calibration Results: "


class _Ratios(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.found: list[list[float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith(PREFIX):
            self.found.append([float(v) for v in ast.literal_eval(text[len(PREFIX):])])


def calibrate(gen: GenerateSpec, settings: Settings, device: torch.device) -> list[float]:
    """The MagCache ratios of ``gen.model`` over ``gen.num_inference_steps`` steps (the
    conditional pass's, the first diffusers reports)."""
    from diffusers import MagCacheConfig

    info = read_model(model_folder(gen.model))
    check_request(gen, info, settings)
    models = ModelCache(device, 2**62)
    entry = models.get(info.path, models.resolve_dtype(gen.dtype), "exact", info.pipeline)
    logger = logging.getLogger("diffusers.hooks.mag_cache")
    handler, level = _Ratios(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    transformer: Any = entry.pipe.transformer
    transformer.enable_cache(MagCacheConfig(calibrate=True,
                                            num_inference_steps=gen.num_inference_steps))
    try:
        positive, negative = encode_prompt(entry.pipe, gen, device, on_host=False)
        denoise(entry.pipe, gen, info, positive, negative, lambda *_: None, lambda: False)
    finally:
        transformer.disable_cache()
        logger.removeHandler(handler)
        logger.setLevel(level)
    if not handler.found:
        raise RuntimeError("diffusers reported no MagCache calibration ratios")
    return handler.found[0]
