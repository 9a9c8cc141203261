"""How long a job will take on a CPU worker, said when that is over a minute, calibrated from
what this machine measures.

A Wan VAE decode or denoise at a real size runs for many minutes on a CPU (a 480p decode with
random weights ran 765 s), where a GPU takes seconds. A person who started a CPU worker to try
the fleet should hear so before waiting, with a figure that holds. It is made twice:

1. **Before the job** (said at once when over a minute): its work over this machine's speed at
   each kind of work, measured here at the job's start by three probes of a few tens of
   milliseconds each, so they meet the cores and the load the job will meet:

   - ``conv``: a 3x3x3 ``Conv3d`` of 192 channels on a causally padded 2x32x32 input, the
     VAE decode's middle stage at a smaller size. (A matmul probe stood for everything before:
     on a busy host it ran 6-12 times slower while a decode ran 2 times slower, and ``make
     demo`` was told ~6 min for a 30 s job. A 96-channel probe on 24x24 came next: on an AMD
     EPYC it ran at half the decoder's own convolutions' rate, 63-115 against 150-220 GFLOP/s,
     and ``make demo``'s decode took 2.4 times its estimate. The CPU's convolution library
     picks its algorithm by shape, and this shape meets the decoder's: 217 GFLOP/s there);
   - ``matmul``: a 1024x1024 float32 matmul, the transformer's and text encoder's layers;
   - ``op``: one small tensor op, what a small model spends most of its time on.

   The work, from the model folder's configs: the text encoder's and the transformer's FLOPs
   per forward (2 x parameters x tokens, the transformer's attention 4 x layers x tokens² x
   width; two forwards per step with classifier-free guidance) and their ops (``OPS`` per
   layer); the VAE decode at ``DECODE_FLOP_PER_PIXEL`` per output pixel-frame times its cost
   relative to Wan2.1's VAE (``decode_scale``), measured against the conv probe.
2. **While it runs**, from its own pace (``Pace``, a progress hook): once a denoise step or a
   decoded chunk past the first has been timed (the first of each carries one-time costs), the
   rest is projected from them: steps are alike, and so are chunks. A job found over a minute
   is said then, and a figure said before is said again when the job's own pace makes it
   twice as long, or half.

Only CPU workers estimate; the pattern decoder is too cheap to matter.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
#: Conv-probe FLOPs per output pixel-frame of Wan2.1's VAE decode on a CPU: its seconds per
#: pixel-frame times the conv probe's FLOP/s. Its convolutions count 8.5e6 per pixel-frame (at
#: 96x96, summed over the decoder's layers); they are 90 % of the decode's time, and run at
#: the probe's rate (AMD EPYC, 2 cores: 1.0e7 measured at 96x96).
DECODE_FLOP_PER_PIXEL = 1.0e7
#: A small VAE (few channels) is bound by memory, not FLOPs: its cost per pixel does not fall
#: with the square of its width below this share of Wan2.1's (measured: the tiny Wan2.2-layout
#: VAE of ``framefleet models tiny``, 16 channels, costs 3.4 % of Wan2.1's 96 at 96x96 and
#: 6.8 % at 64x64, 9 frames, where each chunk's fixed costs weigh more).
DECODE_SCALE_FLOOR = 0.05
#: What a forward costs beyond its FLOPs, per layer (a transformer block, a text encoder
#: layer), and a denoise step beyond its forwards (the scheduler, the previews), in units of
#: the op probe: what a model too small for its FLOPs to matter spends (the tiny models' 2
#: layers: 0.15-0.4 s a step on 2 busy cores, where their FLOPs take microseconds).
OPS = {"transformer": 6000.0, "text_encoder": 10000.0, "step": 10000.0}
#: Reports of a stage that ``Pace`` leaves out before it times the rest: the first decoded
#: chunk (one frame) and the first of four carry one-time costs.
SKIP = {"denoise": 0, "decode": 1}
#: Wan's prompt length (UMT5, max_sequence_length).
TEXT_TOKENS = 512


@dataclass(frozen=True)
class Speeds:
    """What this machine does per second at each kind of work, measured now."""

    matmul: float  # FLOP/s of a 1024x1024 float32 matmul
    conv: float  # FLOP/s of a 3x3x3 Conv3d, 192 channels in and out
    op_s: float  # seconds per small tensor op


def _rate(work: Callable[[], Any], flop: float, seconds: float) -> float:
    """FLOP/s of ``work`` (``flop`` each call): the median of three windows of ``seconds``
    (one slow window, another process's burst, does not decide it)."""
    work()  # the first call allocates
    rates = []
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds or n < 2:
            work()
            n += 1
        rates.append(n * flop / elapsed)
    return statistics.median(rates)


@torch.inference_mode()
def measure_speeds(seconds: float = 0.03) -> Speeds:
    """The three probes (see the module's docstring), about ``10 x seconds`` in all."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    matmul = _rate(lambda: a @ b, 2 * 1024**3, seconds)
    conv3d = torch.nn.Conv3d(192, 192, 3)  # padded as the decoder pads: before the call
    x = torch.randn(1, 192, 4, 34, 34)
    conv = _rate(lambda: conv3d(x), 2 * 192 * 192 * 27 * 2 * 32 * 32, seconds)
    y = torch.zeros(64)
    ops = _rate(lambda: [y + 1.0 for _ in range(50)], 50, seconds)
    return Speeds(matmul, conv, 1 / ops)


def matmul_flops(seconds: float = 0.03) -> float:
    """This CPU's float32 matmul rate (FLOP/s), as the estimate measures it."""
    return measure_speeds(seconds).matmul


def _config(folder: Path, part: str) -> dict[str, Any]:
    try:
        loaded = json.loads((folder / part / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _denoise_s(gen: GenerateSpec, folder: Path, spatial: int, temporal: int,
               speeds: Speeds) -> float:
    """The text encode's and the denoise's seconds, from the folder's configs."""
    cfg = 2 if gen.guidance_scale > 1 else 1
    text = _config(folder, "text_encoder")
    d, layers, ff = (int(text.get(k, 0)) for k in ("d_model", "num_layers", "d_ff"))
    encode = (2 * layers * (4 * d * d + 3 * d * ff) * TEXT_TOKENS * cfg / speeds.matmul
              + layers * OPS["text_encoder"] * speeds.op_s * cfg)
    tr = _config(folder, "transformer")
    width = int(tr.get("num_attention_heads", 0)) * int(tr.get("attention_head_dim", 0))
    layers, ff = int(tr.get("num_layers", 0)), int(tr.get("ffn_dim", 0))
    patch = tr.get("patch_size") or [1, 2, 2]
    tokens = (((gen.num_frames - 1) // temporal + 1) // int(patch[0])
              * (gen.height // spatial // int(patch[1])) * (gen.width // spatial // int(patch[2])))
    params = layers * (8 * width * width + 2 * width * ff)
    flop = (2 * params * tokens + 4 * layers * tokens * tokens * width) * cfg
    step = (flop / speeds.matmul + (layers * OPS["transformer"] * cfg + OPS["step"])
            * speeds.op_s)
    return float(encode + step * gen.num_inference_steps)


def decode_scale(vae: Any) -> float:
    """The decode's cost per output pixel relative to Wan2.1's VAE (width 96, 2 residual blocks
    per stage), from a VAE config (a dict, or diffusers' config): its convolutions' width
    squared and their count, and no less than ``DECODE_SCALE_FLOOR``."""
    get = vae.get if hasattr(vae, "get") else lambda k, d=None: getattr(vae, k, d)
    width = float(get("decoder_base_dim", None) or get("base_dim", None) or 96)
    blocks = float(get("num_res_blocks", None) or 2)
    return max(DECODE_SCALE_FLOOR, (width / 96) ** 2 * (blocks + 1) / 3)


def estimate_s(speeds: Speeds, pixel_frames: int, gen: GenerateSpec | None = None,
               folder: Path | None = None, spatial: int = 8, temporal: int = 4,
               scale: float = 1.0) -> dict[str, float]:
    """Seconds per part (``denoise`` with the text encode, ``decode``) at ``speeds``;
    ``scale``: the VAE's (:func:`decode_scale`)."""
    out = {"decode": pixel_frames * DECODE_FLOP_PER_PIXEL * scale / speeds.conv}
    if gen is not None and folder is not None:
        out = {"denoise": _denoise_s(gen, folder, spatial, temporal, speeds), **out}
    return out


def say(total_s: float, how: str) -> str:
    """The warning's words for a job of ``total_s`` (``how``: what the figure is made of)."""
    return (f"this CPU worker estimates {_minutes(total_s)} for this job ({how}): a GPU worker "
            "takes seconds; fewer frames, a smaller size or fewer steps finish sooner")


def before(parts: dict[str, float], speeds: Speeds) -> str:
    """The warning before the job: its parts, and the speeds the probes measured."""
    each = ", ".join(f"{k} {_minutes(v)}" for k, v in parts.items())
    return say(sum(parts.values()), f"{each}; this CPU runs convolutions at "
               f"{speeds.conv / 1e9:.0f} GFLOP/s, matmuls at {speeds.matmul / 1e9:.0f}")


def _minutes(seconds: float) -> str:
    return f"~{seconds:.0f} s" if seconds < 120 else f"~{seconds / 60:.0f} min"


@dataclass
class Pace:
    """A progress hook: the job's own steps and chunks, timed, and what they make of the rest.

    ``prior``: the estimate before the job, by part; ``said_s``: the total said so far (None:
    nothing said); ``projections``: every projection from the job's pace (seconds from the
    hook's start to the job's end, when made), for the record and the tests."""

    run: Run
    prior: dict[str, float]
    speeds: Speeds
    said_s: float | None = None
    start: float = field(default_factory=time.perf_counter)
    projections: list[tuple[float, float]] = field(default_factory=list)
    _first: dict[str, tuple[float, int]] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)

    def __call__(self, p: Progress) -> None:
        try:
            self._observe(p)
        except Exception as e:  # noqa: BLE001 - an estimate is advice; the job goes on
            log.debug("job %s: no projection: %s", self.run.spec.job_id, e)

    def _observe(self, p: Progress) -> None:
        now = time.perf_counter()
        if p.stage == "denoise":
            done, total, kind = p.steps_done, p.steps_total, "denoise"
        elif p.stage == "decode":
            done, total, kind = p.frames_done, p.frames_total, "decode"
        else:
            return
        # Timed from the first step, or the second chunk, on: the first of each carries the
        # one-time costs (a chunk's first new shapes come with the first two).
        if done < 1 or total <= 0:
            return
        seen = self._seen[kind] = self._seen.get(kind, 0) + 1
        if seen <= SKIP[kind]:
            return
        first = self._first.setdefault(kind, (now, done))
        if done <= first[1]:
            return
        per_unit = (now - first[0]) / (done - first[1])
        left = per_unit * (total - done)
        if kind == "denoise":  # the decode to come: the estimate before the job
            left += self.prior.get("decode", 0.0)
        self.projections.append((now - self.start, now - self.start + left))
        self._say_if_changed(now - self.start + left, kind, done, total)

    def _say_if_changed(self, total_s: float, kind: str, done: int, total: int) -> None:
        said = self.said_s
        if said is None and total_s <= WARN_OVER_S:
            return
        if said is not None and said / 2 < total_s < said * 2:
            return
        self.said_s = total_s
        unit = "steps denoised" if kind == "denoise" else "frames decoded"
        text = say(total_s, f"from its own pace: {done} of {total} {unit} so far")
        self.run.warning = text
        log.warning("job %s: %s", self.run.spec.job_id, text)


def warn_if_slow(run: Run, device: torch.device, latents: Latents | None = None) -> None:
    """On a CPU worker: estimate the run (a generate job before it starts, from its spec; a
    decode job from its loaded ``latents``) and, over a minute, log it and carry it in every
    progress report (``Run.warning``: the CLI's bar, ``status``); then follow the job's pace
    (``Pace``) and say it again where that changes the figure. Never fails the job."""
    if device.type != "cpu":
        return
    try:
        parts = _parts(run, latents)
        if parts is None:
            return
        speeds = measure_speeds()
        estimate = estimate_s(speeds, *parts)
        pace = Pace(run, estimate, speeds)
        run.progress_hooks.insert(0, pace)
        if sum(estimate.values()) <= WARN_OVER_S:
            return
        pace.said_s = sum(estimate.values())
        run.warning = before(estimate, speeds)
        log.warning("job %s: %s", run.spec.job_id, run.warning)
        gen = run.spec.generate  # said now, not after the text encode or first chunk
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
