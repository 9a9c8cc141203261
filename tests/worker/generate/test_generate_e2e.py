"""Generate jobs through real Redis, SeaweedFS and a Celery worker: the hand-off is exact,
progress goes denoise then frames, cancel and SIGKILL mid-denoise, bad specs fail at once."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from producer.app import TASK_NAME
from producer.client import Client, JobHandle
from producer.errors import JobCancelled, JobFailed
from producer.settings import Settings
from producer.wire.spec import (
    DEFAULT_TENANT,
    DecoderSpec,
    InputSpec,
    JobSpec,
    OutputSpec,
    Progress,
    VideoSpec,
    job_key,
)
from tests.e2e.chaos_helpers import kill_pool_child, new_pool_child, wait_for
from tests.worker.generate.tiny import (
    reference_latents,
    threads,
    tiny_generate,
    without_transformer,
)
from worker.pipeline.encode import read_frames_rgb
from worker.run import Run, default_decoders, run_job

pytestmark = pytest.mark.e2e


def _spec(job_id: str, bucket: str, model: Path, **kw: Any) -> JobSpec:
    return JobSpec(job_id=job_id, tenant="gen", generate=tiny_generate(model, **kw),
                   output=OutputSpec(uri=f"s3://{bucket}/out"), video=VideoSpec(segment_frames=4))


def _get(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())


def _keys(s3: Any, bucket: str, prefix: str) -> set[str]:
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"] for o in listed}


def _watch(handle: JobHandle, timeout: float = 120) -> list[Progress]:
    """Every distinct PROGRESS payload seen until the job finishes."""
    seen: list[Progress] = []
    deadline = time.monotonic() + timeout
    while handle.status() not in ("SUCCESS", "FAILURE", "REVOKED"):
        p = handle.progress()
        if p is not None and (not seen or seen[-1] != p):
            seen.append(p)
        assert time.monotonic() < deadline, f"{handle.job_id} did not finish"
        time.sleep(0.01)
    return seen


def _mid_denoise(handle: JobHandle) -> Progress | None:
    p = handle.progress()
    if p is not None and p.stage == "denoise" and 0 < p.steps_done < p.steps_total:
        return p
    return None


def test_hand_off_exact_and_progress_in_order(
    client: Client, worker: Any, s3: Any, s3_bucket: str, tiny_model: Path, tmp_path: Path,
    tmp_path_factory: Any,
) -> None:
    # Given a generate job that also saves its latents
    spec = _spec("gen-exact", s3_bucket, tiny_model, num_inference_steps=20, save_latents=True)
    handle = client.submit(spec)
    states = _watch(handle)
    result = handle.wait(timeout=10)
    # Then progress went denoise (steps rising) and then frames (rising), never back
    stages = [p.stage for p in states]
    # (a fast job's decode can fall between two polls: the frames then show as upload, the
    # last segments' encode and upload once every frame is decoded)
    assert "denoise" in stages and {"decode", "upload"} & set(stages), stages
    assert stages == sorted(stages, key=["denoise", "decode", "upload"].index), stages
    steps = [p.steps_done for p in states if p.stage == "denoise"]
    frames = [p.frames_done for p in states if p.stage != "denoise"]
    assert steps == sorted(steps) and frames == sorted(frames)
    assert all(p.steps_total == 20 for p in states if p.stage == "denoise")
    # and its latents are exactly diffusers' own for the same seed (no host round trip)
    assert spec.generate is not None
    with threads(1):  # as the worker (OMP_NUM_THREADS=1)
        reference = reference_latents(spec.generate)
    prefix = "out/gen/gen-exact/"
    saved = load_safetensors(_get(s3, s3_bucket, prefix + "latents.safetensors"))["latents"]
    assert torch.equal(saved, reference)
    assert result.manifest.latents_uri == f"s3://{s3_bucket}/{prefix}latents.safetensors"
    # and the MP4 frames equal a decode of those latents with the model's VAE and encoder
    save_file({"latents": reference}, tmp_path / "ref.safetensors")
    settings = Settings(device="cpu", file_roots=str(tmp_path_factory.getbasetemp()))
    decode = JobSpec(job_id="ref", input=InputSpec(uri=(tmp_path / "ref.safetensors").as_uri()),
                     decoder=DecoderSpec(weights=(tiny_model / "vae").as_uri()),
                     output=OutputSpec(uri=tmp_path.as_uri()), video=spec.video)
    with threads(1):
        expected = run_job(decode, default_decoders(settings), Run(decode, settings=settings))
    assert len(result.manifest.segments) == len(expected.manifest.segments) == 3
    for got, want in zip(result.manifest.segments, expected.manifest.segments, strict=True):
        path = tmp_path / f"got-{got.index}.mp4"
        path.write_bytes(_get(s3, s3_bucket, prefix + f"segment-{got.index:05d}.mp4"))
        a, b = read_frames_rgb(path), read_frames_rgb(Path(want.uri.removeprefix("file://")))
        assert len(a) == len(b) == got.frames
        assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert result.cost is not None
    # previews are on by default: their stage is priced too
    assert [s.stage for s in result.cost.stages] == ["text_encode", "denoise", "preview",
                                                     "decode", "upload_wait", "s3"]
    assert result.timings.denoise_s > 0


def test_cancel_mid_denoise_is_revoked_without_manifest(
    client: Client, worker: Any, s3: Any, s3_bucket: str, tiny_model: Path
) -> None:
    handle = client.submit(_spec("gen-cancel", s3_bucket, tiny_model, num_inference_steps=1500))
    p = wait_for(lambda: _mid_denoise(handle), 60, "denoise progress")
    client.cancel(handle.key)
    with pytest.raises(JobCancelled):
        handle.wait(timeout=60)
    assert handle.status() == "REVOKED"
    # no manifest, no segment (the previews made before the cancel stay, by design)
    assert not {k for k in _keys(s3, s3_bucket, "out/gen/gen-cancel/") if "/previews/" not in k}
    assert "gen-cancel cancelled while denoising" in worker.log_text()
    print(f"cancelled at denoise {p.steps_done}/{p.steps_total} or later")


def test_sigkill_mid_denoise_then_identical_segments(
    client: Client, worker: Any, s3: Any, s3_bucket: str, tiny_model: Path
) -> None:
    # Given a job whose pool process is SIGKILLed mid-denoise
    handle = client.submit(_spec("gen-kill", s3_bucket, tiny_model, num_inference_steps=400))
    p = wait_for(lambda: _mid_denoise(handle), 60, "denoise progress")
    old = kill_pool_child(worker)
    new_pool_child(worker, old)
    # When it is delivered again (reject_on_worker_lost) and finishes
    result = handle.wait(timeout=180)
    assert "WorkerLostError" in worker.log_text()
    # Then its segments are byte-identical to an uninterrupted run of the same generate spec
    clean = client.submit(_spec("gen-clean", s3_bucket, tiny_model, num_inference_steps=400))
    reference = clean.wait(timeout=180)
    assert ([s.sha256 for s in result.manifest.segments]
            == [s.sha256 for s in reference.manifest.segments])
    for seg in result.manifest.segments:
        data = _get(s3, s3_bucket, f"out/gen/gen-kill/segment-{seg.index:05d}.mp4")
        assert hashlib.sha256(data).hexdigest() == seg.sha256
    print(f"killed at denoise {p.steps_done}/{p.steps_total}; rerun identical")


def test_bad_generate_specs_fail_at_once_naming_the_field(
    client: Client, worker: Any, s3: Any, s3_bucket: str, tiny_model: Path, tmp_path: Path
) -> None:
    good = _spec("gen-good", s3_bucket, tiny_model).model_dump(mode="json")
    bare = without_transformer(tiny_model, tmp_path / "bare")

    def change(**kw: Any) -> dict[str, Any]:
        payload = {**good, "job_id": f"bad-{uuid.uuid4().hex[:8]}"}
        payload["generate"] = {**good["generate"], **kw}
        return payload

    both = {**change(), "input": {"uri": f"s3://{s3_bucket}/in/z.safetensors"}}
    cases = {
        "missing folder": (change(model=(tmp_path / "nowhere").as_uri()),
                           "generate.model: no such folder"),
        "no transformer": (change(model=bare.as_uri()), "has no transformer"),
        "80 frames": (change(num_frames=80), "generate.num_frames"),
        "size": (change(height=40), "generate.height: 40 is not a multiple of 16"),
        # beyond the tiny model's rotary positions (rope_max_seq_len 32): refused before the
        # model loads, not a shape error deep in the transformer
        "past the reach": (change(width=528, height=512),
                           "generate.width: width 528 is over this model's reach: at most 512"),
        "129 frames": (change(num_frames=129), "generate.num_frames: frames 129 is over this "
                       "model's reach: at most 125"),
        "0 steps": (change(num_inference_steps=0), "generate.num_inference_steps"),
        "both": (both, "input, generate: give exactly one"),
    }
    for name, (payload, words) in cases.items():
        key = job_key(payload.get("tenant", DEFAULT_TENANT), payload["job_id"])
        client.app.send_task(TASK_NAME, args=[payload], task_id=key)
        handle = JobHandle(client.app, key)
        t0 = time.monotonic()
        with pytest.raises(JobFailed) as e:
            handle.wait(timeout=30)
        assert words in e.value.message, (name, e.value.message)
        assert "InvalidJobError" in e.value.kind, name
        assert time.monotonic() - t0 < 30
    assert "Retry in" not in worker.log_text()  # failed at once: no retry loop
    # and the worker runs the next good job
    good_result = client.submit(_spec("gen-good", s3_bucket, tiny_model)).wait(timeout=60)
    assert good_result.manifest.frames == 9
