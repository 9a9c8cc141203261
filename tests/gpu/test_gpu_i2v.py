"""Image-to-video jobs on a real GPU (``pytest -m gpu``), on tiny random pipelines: the TI2V
and I2V layouts' latents equal diffusers' WanImageToVideoPipeline (eager on both sides);
compiled, they stay close."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from producer.settings import Settings
from producer.wire.spec import GenerateSpec, JobSpec, OutputSpec, VideoSpec
from worker.generate.denoise.loop import generator, job_pipeline
from worker.generate.handoff import vae_latents
from worker.generate.model.cache import ModelCache
from worker.generate.model.presets import build_pipeline, save_configs
from worker.generate.request.folder import read_model
from worker.inputs.image import load_image
from worker.run import DecoderCache, Run, run_job

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda", 0)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize(("preset", "h", "w"), [("tiny-ti2v", 64, 64), ("tiny-i2v", 32, 48)])
@pytest.mark.parametrize("compiled_sizes", [0, 4])
def test_image_to_video_on_cuda_equals_diffusers(preset: str, h: int, w: int,
                                                 compiled_sizes: int) -> None:
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rng = np.random.default_rng(0)
        Image.fromarray((rng.random((40, 60, 3)) * 255).astype(np.uint8)).save(root / "i.png")
        settings = Settings(device="cuda", file_roots=str(root), work_dir=str(root),
                            compiled_sizes=compiled_sizes)
        pipe = build_pipeline(preset, CUDA, torch.bfloat16, seed=0)
        folder = save_configs(pipe, root / preset)
        models = ModelCache(CUDA, 2**40, compiled_sizes=compiled_sizes)
        models.adopt(folder, pipe, "exact")
        fields: dict[str, Any] = {
            "model": folder.as_uri(), "prompt": "a fox", "height": h, "width": w,
            "num_frames": 9, "num_inference_steps": 4, "seed": 1, "save_latents": True,
            "image": (root / "i.png").as_uri()}
        gen = GenerateSpec(**fields)
        spec = JobSpec(job_id="i2v", generate=gen, output=OutputSpec(uri=(root / "o").as_uri()),
                       video=VideoSpec(segment_frames=4))
        result = run_job(spec, DecoderCache(CUDA, models=models), Run(spec, settings=settings))
        assert result.manifest.latents_uri is not None
        z = load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]
        sized = load_image(gen.image or "", "generate.image", w, h, "crop", settings).image
        run = job_pipeline(pipe, gen, read_model(folder), i2v=True)
        with torch.compiler.set_stance("force_eager"):
            ref = run(image=sized, prompt=gen.prompt, negative_prompt=gen.negative_prompt,
                      height=h, width=w, num_frames=9, num_inference_steps=4,
                      guidance_scale=gen.guidance_scale, generator=generator(gen),
                      output_type="latent", return_dict=False)[0]
        want = vae_latents(pipe.vae, ref).float().cpu()
        facts = result.manifest.generate
        assert facts is not None and facts.compiled == (compiled_sizes > 0)
        if compiled_sizes == 0:
            assert torch.equal(z, want)
        else:
            err = _rel(z, want)
            print(f"{preset} compiled vs eager latents rel L2 {err:.2e}")
            assert err < 5e-2
