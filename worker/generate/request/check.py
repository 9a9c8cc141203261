"""The request stage: everything about a generate job that can be refused before a model loads.

One call, :func:`check_job`, in the order a job meets them: the model folder (under the roots,
every file checked), its configs, the request against the model and the fleet's limits, the
tier against this device, the step cache against the model's experts. Each refusal is an
``InvalidJobError`` naming its field: fatal, never retried.
"""

from __future__ import annotations

import torch

from producer.settings import Settings
from producer.wire.spec import GenerateSpec
from worker.generate.request.folder import ModelInfo, check_request, model_folder, read_model
from worker.generate.tier.stepcache import check_cache
from worker.generate.tier.tiers import check_tier


def check_job(gen: GenerateSpec, device: torch.device, settings: Settings) -> ModelInfo:
    """The checked model folder's facts, or the job's refusal."""
    info = read_model(model_folder(gen.model, settings))
    check_request(gen, info, settings)
    check_tier(gen.tier, device)
    check_cache(gen.cache, info.experts)
    return info
