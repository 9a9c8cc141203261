"""Generate jobs in-process (no services): validation naming the field, the exact hand-off of
latents to the streamed decoder, progress order, determinism, the model cache's budget."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from producer.cost import with_stages
from producer.errors import InvalidJobError, JobCancelled
from producer.settings import Settings
from producer.wire.spec import (
    DecoderSpec,
    InputSpec,
    JobResult,
    JobSpec,
    OutputSpec,
    Progress,
    VideoSpec,
    parse_spec,
)
from tests.worker.generate.tiny import reference_latents, tiny_generate, without_transformer
from worker.generate.model.cache import ModelCache
from worker.pipeline.encode import read_frames_rgb
from worker.run import DecoderCache, Run, default_decoders, run_job

# The models and outputs lie in pytest's temporary folders: the file:// root.
SETTINGS = Settings(device="cpu", max_denoise_steps=50, file_roots=tempfile.gettempdir())



def _job(spec: JobSpec, decoders: DecoderCache, **hooks: Any) -> JobResult:
    """``run_job`` with the tests' settings and any of ``Run``'s hooks."""
    return run_job(spec, decoders, Run(spec, settings=SETTINGS, **hooks))

def _spec(job_id: str, out: Path, **generate: Any) -> JobSpec:
    model = generate.pop("model")
    return JobSpec(job_id=job_id, generate=tiny_generate(model, **generate),
                   output=OutputSpec(uri=out.as_uri()), video=VideoSpec(segment_frames=4))


def _frames(result: Any) -> list[Any]:
    frames = []
    for seg in result.manifest.segments:
        frames += read_frames_rgb(Path(seg.uri.removeprefix("file://")))
    return frames


# --- the spec -------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "words"), [
    ({"num_frames": 80}, "generate.num_frames: num_frames must be 4k+1"),
    ({"num_inference_steps": 0}, "generate.num_inference_steps: Input should be greater"),
    ({"model": "s3://bucket/wan"}, "generate.model: a local"),
    ({"prompt": ""}, "generate.prompt"),
])
def test_bad_generate_fields_are_named(tiny_model: Path, change: dict[str, Any],
                                       words: str) -> None:
    payload = _spec("bad", tiny_model.parent, model=tiny_model).model_dump(mode="json")
    payload["generate"].update(change)
    with pytest.raises(InvalidJobError) as e:
        parse_spec(payload)
    assert words in str(e.value)


def test_exactly_one_of_input_and_generate(tiny_model: Path) -> None:
    payload = _spec("both", tiny_model.parent, model=tiny_model).model_dump(mode="json")
    payload["input"] = {"uri": "s3://b/z.safetensors"}
    with pytest.raises(InvalidJobError, match="input, generate: give exactly one"):
        parse_spec(payload)
    del payload["input"]
    payload["decoder"] = {"name": "pattern"}
    with pytest.raises(InvalidJobError, match="decoder: a generate job decodes with its model"):
        parse_spec(payload)
    del payload["generate"], payload["decoder"]
    with pytest.raises(InvalidJobError, match="input, generate: give exactly one"):
        parse_spec(payload)


# --- what the worker checks against the model folder ----------------------------------------

@pytest.mark.parametrize(("change", "words"), [
    ({"height": 40}, "generate.height: 40 is not a multiple of 16"),
    ({"width": 56}, "generate.width: 56 is not a multiple of 16"),
    ({"num_inference_steps": 51}, "generate.num_inference_steps: 51 exceeds the limit of 50"),
    ({"guidance_scale_2": 3.0}, "generate.guidance_scale_2: only for two-expert models"),
    ({"boundary_ratio": 0.9}, "generate.boundary_ratio: only for two-expert models"),
    ({"num_frames": 4001}, "generate.num_frames: 4001 exceeds the limit"),
])
def test_model_dependent_checks_fail_before_loading(
    tiny_model: Path, tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    decoders = default_decoders(SETTINGS)
    spec = _spec("bad", tmp_path, model=tiny_model, **change)
    with pytest.raises(InvalidJobError, match=words):
        _job(spec, decoders)
    assert decoders.models.keys() == []  # nothing was loaded for it


def test_missing_folder_and_folder_without_transformer(tiny_model: Path, tmp_path: Path) -> None:
    missing = _spec("missing", tmp_path, model=tmp_path / "nowhere")
    with pytest.raises(InvalidJobError, match=r"generate.model: no such folder: .*nowhere"):
        _job(missing, default_decoders(SETTINGS))
    bare = without_transformer(tiny_model, tmp_path / "no-transformer")
    spec = _spec("bare", tmp_path, model=bare)
    with pytest.raises(InvalidJobError, match="generate.model: .* has no transformer"):
        _job(spec, default_decoders(SETTINGS))


# --- the job --------------------------------------------------------------------------------

def test_hand_off_is_exact_and_progress_goes_denoise_then_frames(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Given a generate job that saves its latents
    states: list[Progress] = []
    decoders = default_decoders(SETTINGS)
    spec = _spec("gen", tmp_path, model=tiny_model, save_latents=True)
    result = _job(spec, decoders, progress_hooks=[states.append])
    # Then its latents are exactly those of diffusers' own pipeline for the same seed
    assert spec.generate is not None
    reference = reference_latents(spec.generate)
    assert result.manifest.latents_uri is not None
    saved = load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]
    assert saved.shape == (16, 3, 4, 6) and torch.equal(saved, reference)
    # and its MP4 frames are exactly a decode job's frames of those reference latents, with
    # the model's VAE
    save_file({"latents": reference}, tmp_path / "ref.safetensors")
    decode = JobSpec(job_id="ref", input=InputSpec(uri=(tmp_path / "ref.safetensors").as_uri()),
                     decoder=DecoderSpec(weights=(tiny_model / "vae").as_uri()),
                     output=OutputSpec(uri=tmp_path.as_uri()), video=spec.video)
    expected = _job(decode, decoders)
    got, want = _frames(result), _frames(expected)
    assert len(got) == len(want) == 9 == result.manifest.frames
    assert all((a == b).all() for a, b in zip(got, want, strict=True))
    assert ([s.sha256 for s in result.manifest.segments]
            == [s.sha256 for s in expected.manifest.segments])
    # and progress went denoise 0/2, 1/2, 2/2, then frames
    texts = [p.text for p in states]
    assert texts[:3] == ["denoise 0/2", "denoise 1/2", "denoise 2/2"]
    # (the last segments' encode and upload, once every frame is decoded, report as upload)
    assert {p.stage for p in states[3:]} <= {"decode", "upload"}, [p.stage for p in states]
    assert [p.stage for p in states[3:]][:1] == ["decode"]
    assert states[-1].frames_done == states[-1].frames_total == 9
    assert result.timings.denoise_s > 0 and result.timings.text_encode_s > 0


def test_same_spec_same_segments_other_seed_other_video(tiny_model: Path, tmp_path: Path) -> None:
    decoders = default_decoders(SETTINGS)
    a = _job(_spec("a", tmp_path / "a", model=tiny_model), decoders)
    b = _job(_spec("a", tmp_path / "b", model=tiny_model), default_decoders(SETTINGS))
    c = _job(_spec("c", tmp_path / "c", model=tiny_model, seed=8), decoders)
    assert [s.sha256 for s in a.manifest.segments] == [s.sha256 for s in b.manifest.segments]
    assert [s.sha256 for s in a.manifest.segments] != [s.sha256 for s in c.manifest.segments]


def test_cancel_between_denoise_steps_writes_nothing(tiny_model: Path, tmp_path: Path) -> None:
    steps: list[int] = []

    def progress(p: Progress) -> None:
        if p.stage == "denoise":
            steps.append(p.steps_done)

    spec = _spec("cancel", tmp_path, model=tiny_model, num_inference_steps=10)
    with pytest.raises(JobCancelled, match="cancelled while denoising"):
        _job(spec, default_decoders(SETTINGS), progress_hooks=[progress],
             cancel_checks=[lambda: len(steps) >= 3])
    assert steps == [0, 1, 2]  # stopped after step 2 of 10: the rest were skipped
    # no segment and no manifest (the previews made before the cancel stay, by design)
    assert not [p for p in tmp_path.rglob("*.mp4") if p.parent.name != "previews"]
    assert not list(tmp_path.rglob("manifest.json"))


def test_flow_shift_changes_the_video(tiny_model: Path, tmp_path: Path) -> None:
    decoders = default_decoders(SETTINGS)
    base = _job(_spec("s3", tmp_path / "a", model=tiny_model), decoders)
    shifted = _job(_spec("s9", tmp_path / "b", model=tiny_model, flow_shift=9.0), decoders)
    assert ([s.sha256 for s in base.manifest.segments]
            != [s.sha256 for s in shifted.manifest.segments])
    # and the resident pipeline kept its own scheduler config
    (key,) = decoders.models.keys()
    entry = decoders.models.get(Path(key[0]), key[1], key[2])
    assert entry.pipe.scheduler.config.flow_shift == 3.0


def test_model_cache_budget(tiny_model: Path, tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    probe = ModelCache(cpu, 2**40).get(tiny_model, torch.float32)
    assert probe.bytes > 0
    # A model larger than the budget alone is refused, naming the field and the setting
    with pytest.raises(InvalidJobError, match="generate.model: .*FRAMEFLEET_MODEL_CACHE_GIB"):
        ModelCache(cpu, probe.bytes - 1).get(tiny_model, torch.float32)
    # Room for one: the second model evicts the least recently used
    cache = ModelCache(cpu, probe.bytes + probe.bytes // 2)
    first = cache.get(tiny_model, torch.float32)
    assert cache.get(tiny_model, torch.float32) is first  # resident: not loaded again
    cache.get(tiny_model, torch.bfloat16)
    assert cache.keys() == [(str(tiny_model), torch.bfloat16, "exact")]


def test_stage_costs_add_up_and_cost_report_sums_them() -> None:
    from producer.cli.cost import stage_totals
    from producer.cost import job_cost
    from producer.cost.pricing import default_catalog, prices_for
    from tests.producer.cost.test_cost import make_result

    prices = prices_for("g7e.2xlarge", "on-demand", default_catalog())
    report = job_cost(tenant="t", prices=prices, gpu_seconds=10.0, s3_puts=4,
                      stored_bytes=2**20, video_seconds=5.0)
    staged = with_stages(report, {"text_encode": 1.0, "denoise": 6.0})
    by = {s.stage: s for s in staged.stages}
    assert list(by) == ["text_encode", "denoise", "decode", "s3"]
    assert by["decode"].gpu_seconds == pytest.approx(3.0)
    assert by["denoise"].usd == pytest.approx(0.6 * report.gpu_usd)
    assert by["s3"].usd == pytest.approx(report.s3_put_usd + report.storage_usd_per_month)
    assert sum(s.usd for s in staged.stages) == pytest.approx(report.total_usd)
    assert sum(s.share for s in staged.stages) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="exceed the job's GPU seconds"):
        with_stages(report, {"denoise": 20.0})
    with pytest.raises(ValueError, match="stage must be one of"):
        with_stages(report, {"decode": 1.0})
    # and the cost report sums each stage over jobs (a decode-only job adds decode and s3)
    generated = make_result("g", "t", node="n", finished_at=1.0, wall_s=10.0,
                            video_seconds=5.0, prices=prices)
    decoded = make_result("d", "t", node="n", finished_at=2.0, wall_s=2.0,
                          video_seconds=5.0, prices=prices)
    assert generated.cost is not None and decoded.cost is not None
    results = [
        generated.model_copy(update={"cost": with_stages(generated.cost, {"denoise": 6.0})}),
        decoded.model_copy(update={"cost": with_stages(decoded.cost, {})}),
    ]
    rows = {r.stage: r for r in stage_totals(results)}
    assert rows["denoise"].jobs == 1 and rows["denoise"].gpu_seconds == pytest.approx(6.0)
    assert rows["decode"].jobs == 2 and rows["decode"].gpu_seconds == pytest.approx(6.0)
    assert "text_encode" not in rows
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)


def test_out_of_memory_while_denoising_is_retryable_then_lean(
    tiny_model: Path, tmp_path: Path
) -> None:
    from producer.errors import DeviceOutOfMemory, RetryableError

    decoders = default_decoders(SETTINGS)
    _job(_spec("other", tmp_path / "o", model=tiny_model, dtype="bfloat16"), decoders)
    entry = decoders.models.get(tiny_model, torch.float32)
    assert len(decoders.models.keys()) == 2

    def oom(*_: Any) -> None:  # what the CUDA caching allocator raises when it cannot allocate
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    hook = entry.pipe.transformer.register_forward_pre_hook(oom)
    try:
        with pytest.raises(DeviceOutOfMemory, match="CUDA out of memory denoising oom") as e:
            _job(_spec("oom", tmp_path / "a", model=tiny_model), decoders)
        assert isinstance(e.value, RetryableError)  # the task layer retries it once, lean
    finally:
        hook.remove()
    assert not list(tmp_path.glob("a/**/*.mp4"))
    # The lean retry (tiled=True) keeps only this job's model resident and succeeds
    result = _job(_spec("oom", tmp_path / "b", model=tiny_model), decoders, tiled=True)
    assert result.manifest.frames == 9
    assert decoders.models.keys() == [(str(tiny_model), torch.float32, "exact")]


def test_stage_metrics_and_progress_bar_cover_the_new_stages(
    tiny_model: Path, tmp_path: Path
) -> None:
    from producer.client.handle import _Bar
    from worker import metrics

    def count(stage: str) -> float:
        value = metrics.WORKER_REGISTRY.get_sample_value(
            "framefleet_stage_seconds_count", {"stage": stage, "tier": "exact", "cache": "none"})
        return value or 0.0

    before = {s: count(s) for s in ("text_encode", "denoise")}
    result = _job(_spec("m", tmp_path, model=tiny_model), default_decoders(SETTINGS))
    metrics.observe_job("success", "gen", result)
    assert {s: count(s) - before[s] for s in before} == {"text_encode": 1.0, "denoise": 1.0}
    total = metrics.WORKER_REGISTRY.get_sample_value(
        "framefleet_stage_seconds_sum", {"stage": "denoise", "tier": "exact", "cache": "none"})
    assert total is not None and total >= result.timings.denoise_s > 0
    # the CLI bar shows denoise steps, then frames
    bar = _Bar("job")
    try:
        bar.update(Progress(frames_done=0, frames_total=9, segments_done=0, stage="denoise",
                            steps_done=12, steps_total=50))
        task = bar.progress.tasks[0]
        assert (task.completed, task.total, task.fields["unit"]) == (12, 50, "denoise steps")
        bar.update(Progress(frames_done=5, frames_total=9, segments_done=1))
        task = bar.progress.tasks[0]
        assert (task.completed, task.total, task.fields["unit"]) == (5, 9, "frames")
    finally:
        bar.close()


@pytest.mark.parametrize(("preset", "fields"), [
    ("tiny-ti2v", {"height": 64, "width": 64}),
    ("tiny-a14b", {"guidance_scale_2": 3.0, "num_inference_steps": 4}),
])
def test_wan22_layouts_hand_off_exactly(
    wan22_models: dict[str, Path], tmp_path: Path, preset: str, fields: dict[str, Any]
) -> None:
    model = wan22_models[preset]
    decoders = default_decoders(SETTINGS)
    spec = _spec(preset, tmp_path / "a", model=model, save_latents=True, **fields)
    result = _job(spec, decoders)
    assert spec.generate is not None and result.manifest.latents_uri is not None
    reference = reference_latents(spec.generate)
    assert torch.equal(load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"],
                       reference)
    save_file({"latents": reference}, tmp_path / "ref.safetensors")
    # TI2V-5B decodes with Wan2.2's own VAE (48 channels), A14B with Wan2.1's
    name = "wan2.2-vae" if preset == "tiny-ti2v" else "wan2.1-vae"
    decode = JobSpec(job_id="ref", input=InputSpec(uri=(tmp_path / "ref.safetensors").as_uri()),
                     decoder=DecoderSpec(name=name, weights=(model / "vae").as_uri()),
                     output=OutputSpec(uri=(tmp_path / "ref").as_uri()),
                     # the generate job's frame rate, given explicitly (wan2.2-vae's default is 24)
                     video=VideoSpec(**spec.video.model_dump()))
    expected = _job(decode, decoders)
    got_m, want_m = result.manifest, expected.manifest
    assert (got_m.width, got_m.height, got_m.frames) == (want_m.width, want_m.height, 9)
    assert ([s.sha256 for s in result.manifest.segments]
            == [s.sha256 for s in expected.manifest.segments])
    if preset == "tiny-a14b":  # the boundary between the experts is the spec's to move
        moved = _job(_spec("b", tmp_path / "b", model=model, boundary_ratio=0.5, **fields),
                     decoders)
        assert ([s.sha256 for s in moved.manifest.segments]
                != [s.sha256 for s in result.manifest.segments])
    else:  # 48 is not a multiple of the x16 VAE x patch 2
        with pytest.raises(InvalidJobError, match="generate.width: 48 is not a multiple of 32"):
            _job(_spec("w", tmp_path / "c", model=model, height=64, width=48), decoders)
