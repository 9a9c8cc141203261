"""Generate jobs: a prompt in, latents on the GPU out, handed to the streamed decoder.

The rooms, in the order a job passes through them (``job.generate_latents`` calls them so):

1. ``request``: the model folder (the one place its path is resolved), its file checks
   (``loader``), its configs and the fleet's limits; ``check.check_job`` runs them all
2. ``model``: resident pipelines under a memory budget (``cache``), the fast load path
   (``fastload``), the warm-up (``warm``); random-weight presets for benchmarks and tests
3. ``tier``: exact or fp8 and compiled sizes (``tiers``), step caches (``stepcache``,
   ``calibrate``); ``stance.job_stance`` holds them around one denoise
4. ``conditions``: images and LoRA adapters (``read``, ``adapters``), the prompt (``text``)
5. ``denoise``: diffusers' ``WanPipeline.__call__`` with latent output (``loop``), previews
6. ``handoff``: latents into VAE space for ``decoder.stream``; ``latents.safetensors``
"""

from worker.generate.job import Generated, generate_latents
from worker.generate.model.cache import ModelCache

__all__ = ["Generated", "ModelCache", "generate_latents"]
