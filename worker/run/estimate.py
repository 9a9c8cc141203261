"""How long a job will take on a CPU worker, said before it runs when that is over a minute.

A Wan VAE decode or denoise at a real size runs for many minutes on a CPU (a 480p decode with
random weights ran 765 s), where a GPU takes seconds. A person who started a CPU worker to try
the fleet should hear so before waiting, with a figure. The estimate is work over speed:

- **speed**: this CPU's float32 matmul rate, measured here (a ~0.1 s probe at the job's start,
  so it reflects the cores and the load the job will meet);
- **work**, in matmul-equivalent FLOPs: the text encoder's and the transformer's forward passes
  (2 x parameters x tokens, the transformer's attention 4 x layers x tokens² x width, twice
  with classifier-free guidance, per denoise step), read from the model folder's configs; and
  the Wan VAE decode at ``DECODE_FLOP_PER_PIXEL`` per output pixel-frame, measured on a CPU
  against the same probe (its convolutions run slower than a plain matmul: the constant holds
  that ratio).

It is a rough figure (within a factor of ~2): enough to tell a minute from an hour. Only CPU
workers estimate; the pattern decoder is too cheap to matter.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from producer.wire.base import decode_uri
from producer.wire.spec import GenerateSpec, Progress
from worker.decoders.base import frames_for_latents
from worker.generate.request.folder import read_model
from worker.run.run import Run
from worker.run.source import Latents

log = logging.getLogger(__name__)
#: Jobs estimated longer than this on a CPU get the warning.
WARN_OVER_S = 60.0
#: Matmul-equivalent FLOPs per output pixel-frame of the Wan VAE decode on a CPU: its seconds
#: times the matmul probe's FLOP/s, over pixel-frames (Wan2.1's VAE, random weights, on a
#: 2-core CPU: 1.6e7 for 5 frames of 64x64, first call included, 1.2e7 for 5 of 128x128).
DECODE_FLOP_PER_PIXEL = 1.3e7
#: Wan's prompt length (UMT5, max_sequence_length).
TEXT_TOKENS = 512


def matmul_flops(seconds: float = 0.1) -> float:
    """This CPU's float32 matmul rate (FLOP/s), measured for about ``seconds``."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    a @ b  # the first call allocates
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or n < 3:
        a @ b
        n += 1
    return n * 2 * 512**3 / elapsed


def _config(folder: Path, part: str) -> dict[str, Any]:
    try:
        loaded = json.loads((folder / part / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _denoise_flop(gen: GenerateSpec, folder: Path, spatial: int, temporal: int) -> float:
    """The text encode's and the denoise's FLOPs, from the folder's configs (0 when absent)."""
    cfg = 2 if gen.guidance_scale > 1 else 1
    text = _config(folder, "text_encoder")
    d, layers, ff = (int(text.get(k, 0)) for k in ("d_model", "num_layers", "d_ff"))
    encode = 2 * layers * (4 * d * d + 3 * d * ff) * TEXT_TOKENS * cfg
    tr = _config(folder, "transformer")
    width = int(tr.get("num_attention_heads", 0)) * int(tr.get("attention_head_dim", 0))
    layers, ff = int(tr.get("num_layers", 0)), int(tr.get("ffn_dim", 0))
    patch = tr.get("patch_size") or [1, 2, 2]
    tokens = (((gen.num_frames - 1) // temporal + 1) // int(patch[0])
              * (gen.height // spatial // int(patch[1])) * (gen.width // spatial // int(patch[2])))
    params = layers * (8 * width * width + 2 * width * ff)
    step = (2 * params * tokens + 4 * layers * tokens * tokens * width) * cfg
    return float(encode + step * gen.num_inference_steps)


def decode_scale(vae: Any) -> float:
    """The decode's cost per pixel relative to Wan2.1's VAE (width 96, 2 residual blocks per
    stage), from a VAE config (a dict, or diffusers' config): its convolutions' width squared
    and their count. The tiny VAEs of the tests and demo cost next to nothing."""
    get = vae.get if hasattr(vae, "get") else lambda k, d=None: getattr(vae, k, d)
    width = float(get("decoder_base_dim", None) or get("base_dim", None) or 96)
    blocks = float(get("num_res_blocks", None) or 2)
    return (width / 96) ** 2 * (blocks + 1) / 3


def estimate_s(flops_per_s: float, pixel_frames: int, gen: GenerateSpec | None = None,
               folder: Path | None = None, spatial: int = 8, temporal: int = 4,
               scale: float = 1.0) -> dict[str, float]:
    """Seconds per part (``denoise`` with the text encode, ``decode``) at ``flops_per_s``;
    ``scale``: the VAE's (:func:`decode_scale`)."""
    out = {"decode": pixel_frames * DECODE_FLOP_PER_PIXEL * scale / flops_per_s}
    if gen is not None and folder is not None:
        out = {"denoise": _denoise_flop(gen, folder, spatial, temporal) / flops_per_s, **out}
    return out


def say_if_slow(job_id: str, parts: dict[str, float], flops_per_s: float) -> str | None:
    """The warning for a job estimated over ``WARN_OVER_S`` (logged), else None."""
    total = sum(parts.values())
    if total <= WARN_OVER_S:
        return None
    each = ", ".join(f"{k} {_minutes(v)}" for k, v in parts.items())
    text = (f"this CPU worker estimates {_minutes(total)} for this job ({each}; this CPU "
            f"runs {flops_per_s / 1e9:.0f} GFLOP/s): a GPU worker takes seconds; fewer "
            "frames, a smaller size or fewer steps finish sooner")
    log.warning("job %s: %s", job_id, text)
    return text


def _minutes(seconds: float) -> str:
    return f"~{seconds:.0f} s" if seconds < 120 else f"~{seconds / 60:.0f} min"


def warn_if_slow(run: Run, device: torch.device, latents: Latents | None = None) -> None:
    """On a CPU worker: estimate the run (a generate job before it starts, from its spec; a
    decode job from its loaded ``latents``) and, over a minute, log it and carry it in every
    progress report (``Run.warning``: the CLI's bar, ``status``). Never fails the job."""
    if device.type != "cpu":
        return
    try:
        parts = _parts(run, latents)
        if parts is None:
            return
        speed = matmul_flops()
        run.warning = say_if_slow(run.spec.job_id, estimate_s(speed, *parts), speed)
        if run.warning is not None:  # said now, not after the text encode or first chunk
            gen = run.spec.generate
            run.report(Progress(frames_done=0, segments_done=0, **(
                {"frames_total": gen.num_frames, "stage": "denoise",
                 "steps_total": gen.num_inference_steps} if gen is not None else
                {"frames_total": frames_for_latents(latents.tensor.shape[1])
                 if latents is not None else 0})))
    except Exception as e:  # noqa: BLE001 - an estimate is advice; the job goes on without
        log.debug("job %s: no CPU estimate: %s", run.spec.job_id, e)


def _parts(run: Run, latents: Latents | None) -> tuple[
        int, GenerateSpec | None, Path | None, int, int, float] | None:
    """The estimate's inputs: pixel-frames, the generate spec, its folder, its factors and
    the VAE's cost scale."""
    gen = run.spec.generate
    if gen is not None:
        folder = Path(decode_uri(gen.model, field="generate.model").path)
        info = read_model(folder)
        return (gen.num_frames * gen.height * gen.width, gen, folder, info.spatial_factor,
                info.temporal_factor, decode_scale(_config(folder, "vae")))
    vae = getattr(latents.decoder, "vae", None) if latents is not None else None
    if latents is None or vae is None:  # the pattern decoder: nothing to wait for
        return None
    _, frames, h, w = latents.tensor.shape
    height, width = latents.decoder.output_size(h, w)
    return (frames_for_latents(frames) * height * width, None, None, 8, 4,
            decode_scale(vae.config))
