"""The runs ``generate.py`` times: diffusers' pipeline + export, a framefleet job, and the
quality figures of one tier against the exact tier (rel L2 of latents, PSNR of frames, one
transformer forward against eager).

The benchmark works on the device outside ``run_job`` (diffusers' pipeline, the forward
checks, fp8's quantisation): each such call holds the device as a job of the process's owner
(``worker.owner.DEVICE``), as every job in a worker does. Without it, a decode-graph build
queued by an earlier job (the first-chunk graph) ran on the builder thread beside the
diffusers run: on an H200 with a warm compile cache the build's capture opened while
diffusers' VAE synchronised, which invalidated the capture and failed diffusers' conv3d
("operation not permitted when stream is capturing"); on a cold cache the build only took the
baseline's GPU time. ``settle`` waits for queued builds before a timed run, so neither side of
a row is timed with a build beside it."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch

from producer.settings import Settings
from producer.wire.spec import GenerateSpec, JobSpec
from worker.generate.conditions.text import MAX_SEQUENCE_LENGTH
from worker.generate.denoise.loop import generator, job_pipeline
from worker.generate.tier.tiers import eager_blocks, transformers_of
from worker.owner import DEVICE
from worker.run import DecoderCache, Run, run_job

#: Seconds ``settle`` waits for queued builds (a cold decode-graph compile takes minutes).
SETTLE_S = 900.0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def settle() -> None:
    """Until the decode-graph builds that earlier jobs queued have run: a timed run then
    neither waits for one nor shares the GPU with one."""
    if not DEVICE.drain(SETTLE_S):
        raise RuntimeError(f"decode-graph builds still running after {SETTLE_S:.0f} s: "
                           f"{DEVICE.describe()}")


F = TypeVar("F", bound=Callable[..., Any])


def on_device(what: str) -> Callable[[F], F]:
    """The decorated call settles the builds, then runs holding the device as a job."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def held(*args: Any, **kwargs: Any) -> Any:
            settle()
            with DEVICE.job(f"benchmark: {what}"):
                return fn(*args, **kwargs)

        return cast(F, held)

    return wrap


def export_baseline(frames: Any, path: Path, fps: float) -> str:
    """diffusers' export_to_video; PyAV libx264 (its imageio backend's codec) when the
    backends it needs are missing. Returns which one wrote the file."""
    try:
        from diffusers.utils import export_to_video

        export_to_video(list(frames), str(path), fps=int(fps))
        return "diffusers.export_to_video"
    except (ImportError, AttributeError, RuntimeError, OSError) as e:
        import av

        with av.open(str(path), mode="w") as out:
            stream = out.add_stream("libx264", rate=int(fps))
            stream.height, stream.width = frames.shape[1], frames.shape[2]
            stream.pix_fmt = "yuv420p"
            for frame in frames:
                rgb = (frame * 255).astype(np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        return f"pyav libx264 (export_to_video unavailable: {type(e).__name__})"


@on_device("diffusers")
@torch.no_grad()
def baseline(pipe: Any, gen: GenerateSpec, info: Any, device: torch.device, path: Path,
             image: Any = None) -> dict[str, Any]:
    """diffusers alone, eager, as a user would run it (``WanPipeline``, or
    ``WanImageToVideoPipeline`` with ``image``). The latents its VAE decodes are captured at
    ``vae.decode`` (VAE space: what framefleet's ``latents.safetensors`` holds)."""
    run = job_pipeline(pipe, gen, info, i2v=image is not None)
    captured: dict[str, Any] = {}
    vae = run.vae
    decode = vae.decode

    def capture(z: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        captured["latents"] = z[0].float().cpu()
        captured["loop_end"] = time.perf_counter()
        return decode(z, *args, **kwargs)

    extra = {} if image is None else {"image": image}
    sync(device)
    t0 = time.perf_counter()
    vae.decode = capture
    try:  # the resident transformers are compiled for framefleet: diffusers runs them eager
        with eager_blocks(*transformers_of(pipe)):
            video = run(
                prompt=gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                width=gen.width, num_frames=gen.num_frames,
                num_inference_steps=gen.num_inference_steps, guidance_scale=gen.guidance_scale,
                generator=generator(gen), output_type="np",
                max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False, **extra,
            )[0][0]
    finally:
        del vae.decode  # the instance attribute: the class's method again
    t1 = time.perf_counter()
    how = export_baseline(video, path, 16.0)
    t2 = time.perf_counter()
    return {
        "wall_s": t2 - t0, "encode_and_denoise_s": captured["loop_end"] - t0,
        "decode_postprocess_s": t1 - captured["loop_end"], "export_s": t2 - t1,
        "export": how, "latents": captured["latents"],
    }


def framefleet(spec: JobSpec, decoders: DecoderCache, settings: Settings,
               watch: Callable[[Run], None] | None = None) -> dict[str, Any]:
    """One framefleet job through ``run_job`` (``watch`` attaches hooks to its run first);
    its timings, cost stages and saved latents."""
    from safetensors.torch import load_file

    from producer.cost import cost_for_job

    settle()
    run = Run(spec, cost=cost_for_job, settings=settings)
    if watch is not None:
        watch(run)
    result = run_job(spec, decoders, run)
    t = result.timings
    busy = t.text_encode_s + t.denoise_s + t.decode_s
    assert result.manifest.latents_uri is not None
    latents = load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]
    facts = result.manifest.generate
    return {
        "wall_s": t.wall_s, "load_s": t.load_s, "adapter_load_s": t.adapter_load_s,
        "text_encode_s": t.text_encode_s,
        "denoise_s": t.denoise_s, "decode_gpu_s": t.decode_s,
        "decode_stage_s": (t.wall_s - t.load_s - t.adapter_load_s - t.text_encode_s
                           - t.denoise_s),
        "encode_s": t.encode_s, "upload_s": t.upload_s,
        "gpu_busy_share": busy / t.wall_s, "decode_share": t.decode_s / t.wall_s,
        "frames": result.manifest.frames, "segments": len(result.manifest.segments),
        "compiled": facts.compiled if facts else False,
        "previews": facts.previews if facts else 0, "preview_s": t.preview_s,
        "cost_stages": [s.model_dump() for s in result.cost.stages] if result.cost else [],
        "latents": latents,
        "segment_files": [Path(s.uri.removeprefix("file://")) for s in result.manifest.segments],
    }


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64."""
    a64, b64 = a.double().flatten(), b.double().flatten()
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))


def frames_psnr(got: list[Path], ref: list[Path]) -> float | None:
    """PSNR (dB) of the decoded MP4 frames against the reference's (inf when equal)."""
    from worker.pipeline.encode import read_frames_rgb

    a = np.concatenate([np.stack(read_frames_rgb(p)) for p in got]).astype(np.float64)
    b = np.concatenate([np.stack(read_frames_rgb(p)) for p in ref]).astype(np.float64)
    if a.shape != b.shape:
        return None
    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


@on_device("forward check")
@torch.no_grad()
def forward_error(exact: Any, other: Any, size: tuple[int, int, int], info: Any,
                  device: torch.device) -> float:
    """Relative L2 of one forward of ``other`` (compiled or fp8) against ``exact``'s eager
    forward, at a denoise-like input of this size (no CFG, timestep 500)."""
    h, w, f = size
    cfg = exact.config
    gen = torch.Generator("cpu").manual_seed(0)
    lat = torch.randn(1, cfg.in_channels, (f - 1) // info.temporal_factor + 1,
                      h // info.spatial_factor, w // info.spatial_factor, generator=gen)
    text = torch.randn(1, MAX_SEQUENCE_LENGTH, cfg.text_dim, generator=gen)
    dtype = exact.dtype
    args = {"hidden_states": lat.to(device, dtype), "timestep": torch.tensor([500], device=device),
            "encoder_hidden_states": text.to(device, dtype), "return_dict": False}
    with eager_blocks(exact):
        ref = exact(**args)[0].float()
    got = other(**args)[0].float()
    sync(device)
    return rel_l2(got, ref)
