"""The speed tiers on a real GPU (``pytest -m gpu``), on tiny random Wan pipelines: the exact
tier runs compiled within 2e-2 of eager per forward, fp8 runs quantised and says so, a step
cache leaves no trace in the next job, a size beyond the bound runs eager."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from producer.settings import Settings
from producer.wire.spec import GenerateSpec, JobResult, JobSpec, OutputSpec, VideoSpec
from worker.generate.model.cache import ModelCache
from worker.generate.model.presets import PRESETS, Preset, build_pipeline, save_configs
from worker.run import DecoderCache, Run, run_job

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda", 0)
#: The tiny layout with widths float8 matrix products take (multiples of 16).
PRESETS["tiny-16"] = Preset(
    "tiny-16", PRESETS["tiny"].text_encoder,
    {**PRESETS["tiny"].transformer, "attention_head_dim": 16, "ffn_dim": 64},
    PRESETS["tiny"].vae, PRESETS["tiny"].scheduler, default_size=(32, 48, 9))


class Fleet:
    """One worker's caches on the GPU with a tiny pipeline resident at the tiers asked."""

    def __init__(self, root: Path, tiers: tuple[str, ...], compiled_sizes: int = 4) -> None:
        self.root = root
        self.settings = Settings(device="cuda", file_roots=str(root), work_dir=str(root),
                                 compiled_sizes=compiled_sizes)
        self.models = ModelCache(CUDA, 2**40, compiled_sizes=compiled_sizes)
        self.folder = root / "tiny-16"
        for tier in tiers:
            pipe = build_pipeline("tiny-16", CUDA, torch.bfloat16, seed=0)
            save_configs(pipe, self.folder)
            self.models.adopt(self.folder, pipe, tier)
        self.decoders = DecoderCache(CUDA, models=self.models)
        self.n = 0

    def job(self, **gen: Any) -> tuple[JobResult, torch.Tensor]:
        self.n += 1
        fields = {"model": self.folder.as_uri(), "prompt": "a fox", "height": 32, "width": 48,
                  "num_frames": 9, "num_inference_steps": 6, "guidance_scale": 5.0, "seed": 3,
                  "save_latents": True, **gen}
        spec = JobSpec(job_id=f"g{self.n}", generate=GenerateSpec(**fields),
                       output=OutputSpec(uri=(self.root / "out").as_uri()),
                       video=VideoSpec(segment_frames=4))
        result = run_job(spec, self.decoders, Run(spec, settings=self.settings))
        assert result.manifest.latents_uri is not None
        return result, load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _forward(transformer: Any, eager: bool, padded: bool = False) -> torch.Tensor:
    """One forward; ``padded``: the prompt embeddings end in rows of zeros, as the job path's
    do (``WanPipeline`` pads every prompt to 512 tokens)."""
    g = torch.Generator("cpu").manual_seed(0)
    text = torch.randn(1, 512, 32, generator=g)
    if padded:
        text[:, 7:] = 0
    args = {"hidden_states": torch.randn(1, 16, 3, 4, 6, generator=g).to(CUDA, torch.bfloat16),
            "timestep": torch.tensor([500], device=CUDA),
            "encoder_hidden_states": text.to(CUDA, torch.bfloat16),
            "return_dict": False}
    if eager:
        with torch.compiler.set_stance("force_eager"):
            return transformer(**args)[0].float()
    return transformer(**args)[0].float()


def test_exact_tier_compiled_within_2e2_of_eager_and_no_leak() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), ("exact",))
        (key,) = fleet.models.keys()
        entry = fleet.models.get(Path(key[0]), key[1], key[2])
        assert entry.compiled
        transformer = entry.pipe.transformer
        assert _rel(_forward(transformer, eager=False), _forward(transformer, eager=True)) < 2e-2
        first, z1 = fleet.job()
        assert first.manifest.generate is not None and first.manifest.generate.compiled
        cached, z2 = fleet.job(cache={"kind": "taylorseer", "cache_interval": 2,
                                      "disable_cache_before_step": 2})
        _third, z3 = fleet.job()
        assert not torch.equal(z1, z2)
        assert torch.equal(z1, z3)  # the cache's hooks and state are gone
        assert cached.manifest.generate is not None and cached.manifest.generate.compiled
        with torch.compiler.set_stance("force_eager"):
            _eager, ze = fleet.job()
        assert _rel(z1, ze) < 5e-2  # six steps of kernel-choice differences


def test_fp8_tier_quantised_and_labelled() -> None:
    if torch.cuda.get_device_capability(CUDA) < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), ("exact", "fp8"))
        keys = fleet.models.keys()
        assert [k[2] for k in keys] == ["exact", "fp8"]  # two residents, one budget
        exact = fleet.models.get(Path(keys[0][0]), keys[0][1], "exact").pipe.transformer
        fp8 = fleet.models.get(Path(keys[1][0]), keys[1][1], "fp8").pipe.transformer
        kinds = {type(m.weight).__name__ for m in fp8.blocks.modules()
                 if isinstance(m, torch.nn.Linear)}
        assert any("Float8" in k for k in kinds), kinds
        err = _rel(_forward(fp8, eager=False), _forward(exact, eager=True))
        print(f"fp8 forward rel L2 vs bf16 eager: {err:.3e}")
        assert err < 0.2
        # the job path's prompt embeddings end in zero rows: finite (they were 0/0 = NaN)
        padded = _forward(fp8, eager=False, padded=True)
        assert torch.isfinite(padded).all()
        assert _rel(padded, _forward(exact, eager=True, padded=True)) < 0.2
        result, z8 = fleet.job(tier="fp8", dtype="auto")
        _, z = fleet.job(tier="exact", dtype="auto")
        assert result.manifest.generate is not None and result.manifest.generate.tier == "fp8"
        assert torch.isfinite(z8).all()
        assert 0 < _rel(z8, z) < 0.5


def test_a_size_beyond_the_bound_runs_eager() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), ("exact",), compiled_sizes=1)
        a, _ = fleet.job()
        b, _ = fleet.job(height=48, width=64)
        assert a.manifest.generate is not None and a.manifest.generate.compiled
        assert b.manifest.generate is not None and not b.manifest.generate.compiled
        c, _ = fleet.job()  # the compiled size still runs compiled
        assert c.manifest.generate is not None and c.manifest.generate.compiled
