"""Speed settings of a generate job, in-process on the tiny pipeline: the tier and the step
cache are checked, applied only to the job that asks, never leak into the next job, and are
recorded in the manifest, the result's cost report and the metrics."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from producer.cost import cost_for_job
from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.spec import JobResult, JobSpec, OutputSpec, VideoSpec, parse_spec
from tests.worker.generate.tiny import tiny_generate
from worker.run import DecoderCache, Run, default_decoders, run_job

SETTINGS = Settings(device="cpu", max_denoise_steps=50, file_roots=tempfile.gettempdir())
#: Skips steps at the tiny pipeline's step counts (full steps 0-1, then every second).
TAYLOR = {"kind": "taylorseer", "cache_interval": 2, "disable_cache_before_step": 2}


def _spec(job_id: str, out: Path, model: Path, **generate: Any) -> JobSpec:
    gen = tiny_generate(model, save_latents=True, num_inference_steps=6, **generate)
    return JobSpec(job_id=job_id, generate=gen, output=OutputSpec(uri=out.as_uri()),
                   video=VideoSpec(segment_frames=4))


def _run(spec: JobSpec, decoders: DecoderCache) -> tuple[JobResult, torch.Tensor]:
    result = run_job(spec, decoders, Run(spec, settings=SETTINGS, cost=cost_for_job))
    assert result.manifest.latents_uri is not None
    return result, load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]


def test_fp8_on_the_cpu_fails_at_once_naming_the_field(tiny_model: Path, tmp_path: Path) -> None:
    decoders = default_decoders(SETTINGS)
    spec = _spec("fp8", tmp_path, tiny_model, tier="fp8", dtype="auto")
    with pytest.raises(InvalidJobError, match="generate.tier: fp8 needs a GPU .* on the CPU"):
        run_job(spec, decoders, Run(spec, settings=SETTINGS))
    assert decoders.models.keys() == []  # refused before any model was loaded
    assert not list(tmp_path.rglob("*.mp4"))


def test_exact_then_cache_then_exact_never_leaks(tiny_model: Path, tmp_path: Path) -> None:
    # Given one worker's model cache running exact, then cached, then exact again
    decoders = default_decoders(SETTINGS)
    first, z1 = _run(_spec("a", tmp_path / "a", tiny_model), decoders)
    cached, z2 = _run(_spec("b", tmp_path / "b", tiny_model, cache=TAYLOR), decoders)
    third, z3 = _run(_spec("c", tmp_path / "c", tiny_model), decoders)
    # Then the cache changed the second job's latents (it skipped blocks) ...
    assert not torch.equal(z1, z2)
    # ... and the third job's latents equal the first's: no hook, no state left behind
    assert torch.equal(z1, z3)
    assert ([s.sha256 for s in first.manifest.segments]
            == [s.sha256 for s in third.manifest.segments])
    transformer = decoders.models.get(tiny_model, torch.float32).pipe.transformer
    assert not transformer.is_cache_enabled
    # and each says what it ran with, in the manifest and the cost report
    facts = cached.manifest.generate
    assert facts is not None and (facts.tier, facts.cache, facts.steps) == ("exact",
                                                                            "taylorseer", 6)
    assert facts.cache_params is not None and facts.cache_params["cache_interval"] == 2
    assert first.manifest.generate is not None and first.manifest.generate.cache == "none"
    assert cached.cost is not None and (cached.cost.tier, cached.cost.cache) == ("exact",
                                                                                 "taylorseer")
    assert cached.cost.denoise_steps == 6
    per_step = cached.cost.gpu_seconds_per_denoise_step
    assert per_step == pytest.approx(cached.timings.denoise_s / 6)


@pytest.mark.parametrize("cache", [
    {"kind": "first_block", "threshold": 0.5},
    {"kind": "mag", "mag_ratios": [1.0, 1.0, 1.0, 0.99, 0.98, 0.97], "threshold": 0.5,
     "retention_ratio": 0.0},
    {**TAYLOR, "max_order": 2},
])
def test_each_cache_runs_and_is_recorded(tiny_model: Path, tmp_path: Path,
                                         cache: dict[str, Any]) -> None:
    decoders = default_decoders(SETTINGS)
    _plain, z0 = _run(_spec("p", tmp_path / "p", tiny_model), decoders)
    result, z = _run(_spec("c", tmp_path / "c", tiny_model, cache=cache), decoders)
    assert not torch.equal(z0, z)  # steps were skipped or predicted
    assert result.manifest.generate is not None
    assert result.manifest.generate.cache == cache["kind"]
    _again, z_again = _run(_spec("q", tmp_path / "q", tiny_model), decoders)
    assert torch.equal(z0, z_again)


def test_bad_caches_are_refused_naming_the_field(wan22_models: dict[str, Path],
                                                 tmp_path: Path) -> None:
    payload = _spec("m", tmp_path, wan22_models["tiny-a14b"]).model_dump(mode="json")
    payload["generate"]["cache"] = {"kind": "mag", "threshold": 0.1}
    with pytest.raises(InvalidJobError, match="generate.cache.mag: .*needs the model's "
                                              "mag_ratios; calibrate the model with"):
        parse_spec(payload)
    payload["generate"]["cache"] = {"kind": "first_block", "threshold": 0}
    with pytest.raises(InvalidJobError, match="generate.cache.first_block.threshold"):
        parse_spec(payload)
    payload["generate"]["cache"] = {"kind": "mag", "mag_ratios": [1.0, 0.9]}
    spec = parse_spec(payload)
    with pytest.raises(InvalidJobError, match="generate.cache: a MagCache's ratios are "
                                              "calibrated on one transformer"):
        run_job(spec, default_decoders(SETTINGS), Run(spec, settings=SETTINGS))


def test_new_fields_keep_old_digests(tiny_model: Path, tmp_path: Path) -> None:
    plain = _spec("d", tmp_path, tiny_model)
    payload = plain.model_dump(mode="json")
    for name in ("tier", "cache"):
        del payload["generate"][name]
    old = parse_spec(payload)  # a spec written before the fields existed
    assert old.digest() == plain.digest()
    assert _spec("d", tmp_path, tiny_model, tier="exact").digest() == plain.digest()
    assert _spec("d", tmp_path, tiny_model, tier="fp8", dtype="auto").digest() != plain.digest()
    assert _spec("d", tmp_path, tiny_model, cache=TAYLOR).digest() != plain.digest()


def test_tier_and_cache_label_the_stage_metrics(tiny_model: Path, tmp_path: Path) -> None:
    from worker import metrics

    def count(**labels: str) -> float:
        return metrics.WORKER_REGISTRY.get_sample_value(
            "framefleet_stage_seconds_count", labels) or 0.0

    labels = {"stage": "denoise", "tier": "exact", "cache": "taylorseer"}
    before = count(**labels)
    result, _ = _run(_spec("m", tmp_path, tiny_model, cache=TAYLOR), default_decoders(SETTINGS))
    metrics.observe_job("success", "gen", result)
    assert count(**labels) == before + 1
