"""``framefleet submit``: one job from options (latents to decode, or a prompt to generate
from, with an image and LoRAs) or from a JobSpec JSON file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from producer.cli.bulk import submit_file
from producer.cli.common import (
    WAIT_TIMEOUT_S,
    TimeoutOpt,
    _client,
    _errors,
    _uri,
    _wait,
    broker_name,
    print_result,
)
from producer.cli.flags import as_flags
from producer.cli.output import console, fail, note
from producer.wire.spec import parse_spec


def _new_id() -> str:
    return f"job-{time.strftime('%Y%m%d%H%M%S')}-{time.time_ns() % 10**6}"


def parse_lora(value: str) -> dict[str, Any]:
    """``FILE:SCALE`` (or ``FILE``: scale 1) → a ``generate.loras`` entry."""
    path, sep, scale = value.rpartition(":")
    if not sep or not path or "/" in scale:
        path, scale = value, "1"
    try:
        return {"uri": _uri(path), "scale": float(scale)}
    except ValueError:
        raise ValueError(f"--lora: expected FILE:SCALE, got {value!r}") from None


def parse_preview(value: str) -> int:
    """``--preview N|off``: a preview after step 1 and every N-th step; off (or 0): none."""
    if value.strip().lower() in ("off", "0"):
        return 0
    try:
        every = int(value)
    except ValueError:
        every = -1
    if every < 1:
        raise ValueError(f"--preview: expected a number of steps (1, 2, …) or off, got {value!r}")
    return every


def _generate_job(prompt: str, model: Optional[str], image: Optional[str], loras: list[str],
                  output: Optional[str], size: str, frames: int, steps: int, seed: int,
                  tier: str, preview: Optional[str], **job: Any) -> dict[str, Any]:
    if model is None or output is None:
        fail("--prompt needs --model and --output")
    try:
        width, height = (int(v) for v in size.lower().split("x"))
    except ValueError:
        fail(f"--size: expected WxH, got {size!r}")
    generate: dict[str, Any] = {
        "model": _uri(model), "prompt": prompt, "width": width, "height": height,
        "num_frames": frames, "num_inference_steps": steps, "seed": seed, "tier": tier,
        "loras": [parse_lora(v) for v in loras],
    }
    if image is not None:
        generate["image"] = _uri(image)
    if preview is not None:
        generate["preview"] = {"every": parse_preview(preview)}
    fps = job["fps"]
    return {
        "job_id": job["job_id"] or _new_id(), "tenant": job["tenant"], "generate": generate,
        "video": {"crf": job["crf"], "segment_frames": job["segment_frames"],
                  **({"fps": fps} if fps is not None else {})},
        "output": {"uri": _uri(output)}, "priority": job["priority"],
    }


def submit(
    input: Annotated[Optional[str], typer.Option(
        metavar="URI", help="latents (.safetensors or .npy): s3://bucket/key, file:///path, "
        "or a local path (a path on the workers)")] = None,
    output: Annotated[Optional[str], typer.Option(
        metavar="URI", help="output prefix: s3://bucket/prefix, file:///path or a local "
        "folder; the job writes under PREFIX/TENANT/JOB_ID/")] = None,
    weights: Annotated[Optional[str], typer.Option(
        metavar="DIR", help="the decoder's weights: a diffusers-layout folder on the workers "
        "(config.json + diffusion_pytorch_model.safetensors; a path or file:// URI), or "
        "'random' (seeded random weights: the video is noise). Required by the Wan "
        "decoders")] = None,
    job_id: Annotated[Optional[str], typer.Option(
        metavar="ID", help="idempotency key (default: job-TIMESTAMP-N)")] = None,
    tenant: Annotated[str, typer.Option(metavar="NAME", help="tenant (cost reports)")]
    = "default",
    decoder: Annotated[str, typer.Option(
        metavar="NAME", help="wan2.1-vae | wan2.2-vae | pattern")] = "wan2.1-vae",
    fps: Annotated[Optional[float], typer.Option(
        metavar="FPS", help="frames per second (default: the decoder's model's: 24 for "
        "wan2.2-vae, else 16)")] = None,
    crf: Annotated[int, typer.Option(metavar="N", help="x264 quality, 0-51")] = 20,
    segment_frames: Annotated[int, typer.Option(metavar="N", help="frames per MP4 segment")]
    = 48,
    mode: Annotated[str, typer.Option(metavar="MODE", help="async | sequential")] = "async",
    priority: Annotated[int, typer.Option(metavar="N", help="0-9, 9 the most urgent")] = 5,
    prompt: Annotated[Optional[str], typer.Option(
        metavar="TEXT", help="a generate job: the prompt (with --model; instead of --input)")]
    = None,
    model: Annotated[Optional[str], typer.Option(
        metavar="DIR", help="the diffusers Wan folder on the workers (path or file:// URI)")]
    = None,
    image: Annotated[Optional[str], typer.Option(
        metavar="FILE", help="image-to-video: the first frame (a path on the workers, "
        "file:// or s3://)")] = None,
    lora: Annotated[Optional[list[str]], typer.Option(
        metavar="FILE:SCALE", help="a LoRA .safetensors and its scale (repeatable)")] = None,
    size: Annotated[str, typer.Option(metavar="WxH", help="generate: frame size")]
    = "832x480",
    frames: Annotated[int, typer.Option(metavar="N", help="generate: frames, 4k+1")] = 81,
    steps: Annotated[int, typer.Option(metavar="N", help="generate: denoise steps")] = 50,
    seed: Annotated[int, typer.Option(metavar="N", help="generate: seed")] = 0,
    tier: Annotated[str, typer.Option(metavar="TIER", help="generate: exact | fp8")] = "exact",
    preview: Annotated[Optional[str], typer.Option(
        metavar="N|off", help="generate: a preview after step 1 and every N-th step (printed "
        "with --wait); off: none (default: the worker's FRAMEFLEET_PREVIEW_EVERY, 2)")] = None,
    spec: Annotated[Optional[Path], typer.Option(
        metavar="FILE", help="a JobSpec JSON file, instead of the options above")] = None,
    from_file: Annotated[Optional[Path], typer.Option(
        "--from", metavar="FILE", help="many jobs: a file of JobSpecs, one JSON object per "
        "line (JSON Lines), submitted in bulk; prints each queued job's key, and a line "
        "per line refused (exit status 1 if any was)")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="wait for the job with a progress bar, then print its result (exit "
        "status as for wait)")] = False,
    timeout: TimeoutOpt = WAIT_TIMEOUT_S,
) -> None:
    """Submit one job: latents to decode (--input) or a prompt to generate from (--prompt,
    --model, optionally --image and --lora); print its key (TENANT:JOB_ID, or the job_id for the
    default tenant). Or many: --from FILE, a JobSpec per line (JSON Lines), with a progress
    bar, the key of each job queued and one line per line refused."""
    if from_file is not None:
        if spec is not None or wait:
            fail("--from: a file of JobSpecs, alone (not with --spec or --wait)")
        submit_file(from_file)
        return
    # A spec made of options is refused in their words (--steps, not generate.num_inference_
    # steps); a spec file's refusals name the fields that file spells.
    words = None if spec is not None else as_flags
    with _errors(words):
        if spec is not None:
            try:
                text = spec.read_text()
            except OSError as e:
                fail(f"--spec: cannot read {spec}: {e.strerror or e}")
            job = parse_spec(text)
        elif prompt is not None:
            job = parse_spec(_generate_job(
                prompt, model, image, lora or [], output, size, frames, steps, seed, tier, preview,
                job_id=job_id, tenant=tenant, crf=crf, segment_frames=segment_frames,
                fps=fps, priority=priority))
        else:
            if input is None or output is None:
                fail("--input and --output are required without --spec or --prompt")
            dec: dict[str, Any] = {"name": decoder}
            if weights is not None:
                dec["weights"] = _uri(weights)
            job = parse_spec({
                "job_id": job_id or _new_id(),
                "tenant": tenant, "input": {"uri": _uri(input)}, "decoder": dec,
                "video": {"crf": crf, "segment_frames": segment_frames,
                          **({"fps": fps} if fps is not None else {})},
                "output": {"uri": _uri(output)}, "pipeline": {"mode": mode},
                "priority": priority,
            })
        handle = _client().submit(job)
    # After the block: its warnings (a local path only the workers can judge) come first.
    console.print(job.key, markup=False)  # what status, wait and cancel take
    # stderr: stdout stays the key alone, for JOB=$(framefleet submit …)
    note(f"queued on the broker at {broker_name(handle)} (FRAMEFLEET_BROKER_URL)", "note")
    if wait:
        print_result(_wait(handle, timeout, progress=True, words=words))
