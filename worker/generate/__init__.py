"""Generate jobs: a prompt in, latents on the GPU out, handed to the streamed decoder.

- ``folder``: the model folder (the one place its path is resolved) and its configs' checks
- ``cache``: resident pipelines under a memory budget
- ``text``, ``denoise``: diffusers' ``WanPipeline`` (encode_prompt; __call__ with latent output)
- ``handoff``: latents into VAE space for ``decoder.stream``; ``latents.safetensors``
- ``job``: the stages in order, with progress, cancellation and out-of-memory mapping
- ``presets``: random-weight pipelines at real and tiny sizes (benchmarks, tests)
"""

from worker.generate.cache import ModelCache
from worker.generate.job import Generated, generate_latents

__all__ = ["Generated", "ModelCache", "generate_latents"]
