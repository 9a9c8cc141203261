"""Image-to-video and LoRA jobs through real Redis, SeaweedFS and a Celery worker: the MP4's
frames are a decode of diffusers' own latents; LoRAs equal diffusers' and never leak; hostile
inputs fail fast naming the field and leave the worker healthy; ``framefleet submit --prompt``
sends such a job."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from producer.client import Client
from producer.errors import JobFailed
from producer.settings import Settings
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec
from tests.worker.generate.test_generate_e2e import _get
from tests.worker.generate.tiny import (
    make_lora,
    reference_i2v_latents,
    reference_lora_latents,
    threads,
    tiny_generate,
)
from tests.worker.inputs.test_image import _bomb_png
from worker.inputs.image import load_image
from worker.pipeline.encode import read_frames_rgb
from worker.run import Run, default_decoders, run_job

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[3]


def _spec(job_id: str, bucket: str, model: Path, **kw: Any) -> JobSpec:
    return JobSpec(job_id=job_id, tenant="i2v", generate=tiny_generate(model, **kw),
                   output=OutputSpec(uri=f"s3://{bucket}/out"), video=VideoSpec(segment_frames=4))


def _frames(s3: Any, bucket: str, job_id: str, result: Any, scratch: Path) -> list[Any]:
    frames = []
    for seg in result.manifest.segments:
        path = scratch / f"{job_id}-{seg.index}.mp4"
        path.write_bytes(_get(s3, bucket, f"out/i2v/{job_id}/segment-{seg.index:05d}.mp4"))
        frames += read_frames_rgb(path)
    return frames


def _decoded(latents: torch.Tensor, model: Path, vae: str, tmp: Path, basetemp: Path) -> list:
    """The frames a decode job makes of ``latents`` with the model's own VAE."""
    save_file({"latents": latents}, tmp / "ref.safetensors")
    settings = Settings(device="cpu", file_roots=str(basetemp))
    spec = JobSpec(job_id=f"ref-{uuid.uuid4().hex[:6]}",
                   input=InputSpec(uri=(tmp / "ref.safetensors").as_uri()),
                   decoder=DecoderSpec(name=vae, weights=(model / "vae").as_uri()),
                   output=OutputSpec(uri=tmp.as_uri()), video=VideoSpec(fps=16, segment_frames=4))
    result = run_job(spec, default_decoders(settings), Run(spec, settings=settings))
    return [f for s in result.manifest.segments
            for f in read_frames_rgb(Path(s.uri.removeprefix("file://")))]


def test_image_to_video_frames_are_diffusers_latents_decoded(
    client: Client, worker: Any, s3: Any, s3_bucket: str, wan22_models: dict[str, Path],
    i2v_model: Path, images: dict[str, Path], tmp_path: Path, tmp_path_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)  # this process reads the S3 image
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    # the TI2V layout reads its image from S3, the I2V layout from a file under the roots
    s3.client().upload_file(str(images["png"]), s3_bucket, "in/first.png")
    cases = [("ti2v", wan22_models["tiny-ti2v"], f"s3://{s3_bucket}/in/first.png", 64, 64,
              "wan2.2-vae"),
             ("i2v", i2v_model, images["png"].as_uri(), 32, 48, "wan2.1-vae")]
    for name, model, uri, h, w, vae in cases:
        spec = _spec(f"img-{name}", s3_bucket, model, height=h, width=w, image=uri)
        result = client.submit(spec).wait(timeout=120)
        facts = result.manifest.generate
        assert facts is not None and facts.image is not None and facts.image.size == (w, h)
        settings = Settings(device="cpu", file_roots=str(tmp_path_factory.getbasetemp()),
                            s3_endpoint_url=s3.endpoint_url, s3_region=s3.region)
        sized = load_image(uri, "generate.image", w, h, "crop", settings).image
        assert spec.generate is not None
        (tmp_path / name).mkdir()
        with threads(1):  # as the worker computes them (OMP_NUM_THREADS=1)
            reference = reference_i2v_latents(spec.generate, sized)
            want = _decoded(reference, model, vae, tmp_path / name,
                            tmp_path_factory.getbasetemp())
        got = _frames(s3, s3_bucket, spec.job_id, result, tmp_path)
        assert len(got) == len(want) == 9
        assert all((a == b).all() for a, b in zip(got, want, strict=True)), name


def test_lora_jobs_equal_diffusers_without_leaking(
    client: Client, worker: Any, s3: Any, s3_bucket: str, tiny_model: Path, tmp_path: Path,
) -> None:
    lora = make_lora(tiny_model, tmp_path / "style.safetensors", seed=5)
    plain = client.submit(_spec("lo-plain", s3_bucket, tiny_model,
                                save_latents=True)).wait(timeout=60)
    with_lora = client.submit(_spec("lo-on", s3_bucket, tiny_model, save_latents=True,
                                    loras=[{"uri": lora.as_uri(), "scale": 0.8}])).wait(timeout=60)
    after = client.submit(_spec("lo-after", s3_bucket, tiny_model,
                                save_latents=True)).wait(timeout=60)
    from safetensors.torch import load as load_st

    def latents(job_id: str) -> torch.Tensor:
        return load_st(_get(s3, s3_bucket, f"out/i2v/{job_id}/latents.safetensors"))["latents"]

    gen = tiny_generate(tiny_model)
    with threads(1):  # as the worker (OMP_NUM_THREADS=1)
        reference = reference_lora_latents(gen, [(lora, 0.8)])
    assert torch.equal(latents("lo-on"), reference)
    assert torch.equal(latents("lo-after"), latents("lo-plain"))
    assert ([s.sha256 for s in after.manifest.segments]
            == [s.sha256 for s in plain.manifest.segments])
    facts = with_lora.manifest.generate
    assert facts is not None and facts.loras[0].scale == 0.8
    assert with_lora.cost is not None
    assert "adapter_load" in [s.stage for s in with_lora.cost.stages]


def test_hostile_inputs_fail_fast_naming_the_field(
    client: Client, worker: Any, s3: Any, s3_bucket: str, tiny_model: Path, i2v_model: Path,
    wan22_models: dict[str, Path], images: dict[str, Path], tmp_path: Path,
) -> None:
    ti2v = wan22_models["tiny-ti2v"]
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_bomb_png(30_000, 30_000))
    truncated = tmp_path / "cut.png"
    whole = images["png"].read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    text = tmp_path / "notes.png"
    text.write_text("hello\n")
    pickled = tmp_path / "weights.safetensors"
    pickled.write_bytes(pickle.dumps({"w": 1}))
    other = make_lora(i2v_model, tmp_path / "other.safetensors", targets=("add_k_proj",))
    outside_dir = Path(tempfile.mkdtemp(prefix="ff-outside-"))  # not under the worker's roots
    try:
        outside = outside_dir / "o.png"
        shutil.copyfile(tmp_path / "notes.png", outside)
        link = tmp_path / "link.png"
        os.symlink(outside, link)
        image = {"height": 64, "width": 64}
        cases = {
            "bomb": (ti2v, {**image, "image": bomb.as_uri()},
                     "generate.image: refused as a decompression bomb"),
            "truncated": (ti2v, {**image, "image": truncated.as_uri()},
                          "generate.image: truncated or corrupt PNG"),
            "text": (ti2v, {**image, "image": text.as_uri()},
                     "generate.image: not a PNG, JPEG or WebP image"),
            "pickle": (tiny_model, {"loras": [{"uri": pickled.as_uri()}]},
                       "generate.loras[0]: "),
            "other model": (tiny_model, {"loras": [{"uri": other.as_uri()}]},
                            "generate.loras[0]: "),
            "outside": (ti2v, {**image, "image": outside.as_uri()},
                        "generate.image: file://"),
            "symlink": (ti2v, {**image, "image": link.as_uri()}, "generate.image: file://"),
        }
        for name, (model, kw, words) in cases.items():
            t0 = time.monotonic()
            with pytest.raises(JobFailed) as e:
                client.submit(_spec(f"bad-{uuid.uuid4().hex[:6]}", s3_bucket, model,
                                    **kw)).wait(timeout=60)
            assert words in e.value.message, (name, e.value.message)
            assert time.monotonic() - t0 < 30, name
            if name in ("outside", "symlink"):
                assert "outside the folders this worker may use" in e.value.message
        assert "Retry in" not in worker.log_text()
    finally:
        shutil.rmtree(outside_dir)
    # and the worker runs the next job, the base model as it was
    good = client.submit(_spec("after-bad", s3_bucket, tiny_model)).wait(timeout=60)
    assert good.manifest.frames == 9


def test_framefleet_submit_prompt_image_lora(
    client: Client, worker: Any, s3_bucket: str, wan22_models: dict[str, Path],
    images: dict[str, Path], redis_url: str, tmp_path: Path,
) -> None:
    model = wan22_models["tiny-ti2v"]
    lora = make_lora(model, tmp_path / "s.safetensors", seed=3)
    env = {**os.environ, "FRAMEFLEET_BROKER_URL": redis_url,
           "FRAMEFLEET_RESULT_BACKEND": redis_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "submit", "--prompt", "a fox", "--model",
         str(model), "--image", str(images["png"]), "--lora", f"{lora}:0.5", "--size", "64x64",
         "--frames", "9", "--steps", "2", "--output", f"s3://{s3_bucket}/out", "--tenant", "i2v",
         "--job-id", "cli-i2v", "--wait", "--timeout", "120"],
        env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS i2v:cli-i2v" in done.stdout and "LoRA" in done.stdout
    result = client.get("cli-i2v", tenant="i2v").wait(timeout=10)
    facts = result.manifest.generate
    assert facts is not None and facts.image is not None and facts.loras[0].scale == 0.5
