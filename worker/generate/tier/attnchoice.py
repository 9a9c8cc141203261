"""The attention kernels a worker uses on its GPU, measured once and kept with its artifacts.

Production runs on other GPUs than the ones we measure on, so the choice is measured where it
runs, never assumed:

- **exact**: each exact SDPA kernel (``attnproc.EXACT_BACKENDS`` but math) at the model's
  heads and head size (``MEASURE_TOKENS`` tokens), against torch's default pick. A kernel other
  than the default is used only where it is faster by more than ``MARGIN`` and its error against
  a float32 reference stays within ``EXACT_TOL`` (bfloat16 attention's own level); otherwise
  the exact tier keeps diffusers' attention as it is (``stock``).
- **attn8** (the fp8 tier): cuDNN's float8 attention where it can run here
  (``cudnn8.available``), once, against the same reference: used if its output is finite and
  within ``ATTN8_TOL``. Otherwise the fp8 tier's attention stays exact, and the log says why.

One ``Choice`` per GPU name and torch version for the whole process: every resident's
processors point at it (``attnproc.Mode``), and it is read when the blocks are traced. A
worker keeps it with its compile artifacts (``keep``, ``take``: ``attention-<gpu>.json`` beside
them) so that a worker that loads an artifact traces the same kernels the artifact was compiled
with, instead of a choice of its own that noise could flip, which would miss every cached graph.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from worker.generate.tier import attn8, cudnn8
from worker.generate.tier.attnproc import Mode, exact_attention

log = logging.getLogger(__name__)
#: Tokens of the measurement (the real sizes' kernel ranking already shows at this length).
MEASURE_TOKENS = 8192
#: A non-default exact kernel must be this much faster (relative) to be used.
MARGIN = 0.05
#: Relative L2 error against float32 an exact (bfloat16) kernel may have.
EXACT_TOL = 1e-2
#: Relative L2 error against float32 the 8-bit attention may have (it sanity-checks the
#: kernel; the tier's quality is judged on the model's output, ``bench/generate``).
ATTN8_TOL = 0.1
#: Heads the error is measured on (the float32 reference's score matrix stays small).
CHECK_HEADS = 2


@dataclass
class Choice(Mode):
    """The kernels of one GPU (``Mode``) and how they were chosen."""

    device: str = ""
    torch: str = ""
    measured_ms: dict[str, float] = field(default_factory=dict)
    rel_err: dict[str, float] = field(default_factory=dict)
    why: str = ""


_CHOICES: dict[tuple[str, str], Choice] = {}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def current(device: torch.device) -> Choice:
    """This process's choice for ``device`` (``stock``, no 8-bit attention, until measured)."""
    key = (_device_name(device), str(torch.__version__))
    if key not in _CHOICES:
        _CHOICES[key] = Choice(device=key[0], torch=key[1])
    return _CHOICES[key]


def _time_ms(fn: Any, device: torch.device, reps: int = 10) -> float:
    """Median milliseconds of ``fn`` (CUDA events on CUDA)."""
    fn()
    times = []
    for _ in range(reps):
        if device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    got = out[:, :, :CHECK_HEADS].double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def measure(device: torch.device, heads: int, head_dim: int,
            tokens: int = MEASURE_TOKENS) -> Choice:
    """Measure and set this process's choice for ``device`` (see the module's docstring)."""
    choice = current(device)
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(1, tokens, heads, head_dim, device=device, generator=g,
                           dtype=torch.bfloat16) for _ in range(3))
    head = [t[:, :, :CHECK_HEADS].float() for t in (q, k, v)]
    ref = exact_attention(head[0], head[1], head[2], "math").double()
    default = _time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), device)
    timings, errors, best = {"default": default}, {}, ("stock", default * (1 - MARGIN))
    for backend in ("cudnn", "flash", "efficient"):
        try:
            errors[backend] = _rel(exact_attention(q, k, v, backend), ref)
            timings[backend] = _time_ms(lambda b=backend: exact_attention(q, k, v, b), device)
        except (RuntimeError, NotImplementedError) as e:  # not here: not built, not supported
            log.info("attention: exact %s unavailable on %s: %s", backend, choice.device, e)
            continue
        if errors[backend] <= EXACT_TOL and timings[backend] < best[1]:
            best = (backend, timings[backend])
    choice.exact, why = best[0], []
    choice.attn8, reason = None, cudnn8.available()
    if reason is None:
        try:
            out = attn8.attention8(q, k, v, "cudnn")
            errors["attn8:cudnn"] = _rel(out, ref)
            timings["attn8:cudnn"] = _time_ms(lambda: attn8.attention8(q, k, v, "cudnn"), device)
            ok = bool(torch.isfinite(out).all()) and errors["attn8:cudnn"] <= ATTN8_TOL
            choice.attn8 = "cudnn" if ok else None
            reason = None if ok else f"rel err {errors['attn8:cudnn']:.3g} over {ATTN8_TOL}"
        except Exception as e:  # noqa: BLE001 - any failure of the kernel means: not here
            reason = f"cuDNN float8 attention failed: {type(e).__name__}: {str(e)[:200]}"
    if reason:
        why.append(f"8-bit attention: none ({reason}); the fp8 tier's attention stays exact")
    choice.measured_ms = {k_: round(t, 4) for k_, t in timings.items()}
    choice.rel_err = {k_: float(f"{e:.4g}") for k_, e in errors.items()}
    choice.why = "; ".join(why)
    log.info("attention on %s: exact %s, 8-bit %s (ms at %d tokens: %s)%s", choice.device,
             choice.exact, choice.attn8, tokens, choice.measured_ms,
             f"; {choice.why}" if choice.why else "")
    return choice


def ensure(device: torch.device, transformer: Any) -> Choice:
    """The choice for ``device``, measured at ``transformer``'s heads the first time."""
    choice = current(device)
    if device.type == "cuda" and not choice.measured_ms:
        cfg = transformer.config
        measure(device, cfg.num_attention_heads, cfg.attention_head_dim)
    return choice


def file_name(device_name: str) -> str:
    """Where a GPU's choice is kept beside the compile artifacts."""
    return "attention-" + re.sub(r"[^A-Za-z0-9._-]+", "-", device_name).strip("-") + ".json"


def keep(place: Any, stamp: Any) -> None:
    """Write this process's choice for ``stamp``'s GPU beside its artifact (if measured)."""
    choice = _CHOICES.get((stamp.device, stamp.torch))
    if choice is not None and choice.measured_ms:
        place.write(file_name(stamp.device), json.dumps(asdict(choice), indent=1).encode())


def take(place: Any, stamp: Any, max_bytes: int) -> None:
    """Adopt the choice kept beside ``stamp``'s artifact, when it is this GPU's and torch's:
    the blocks then trace the kernels the artifact was compiled with. A bad file is logged and
    ignored (this process's own measurement stands)."""
    try:
        data = place.read(file_name(stamp.device), max_bytes)
        if data is None:
            return
        doc = json.loads(data)
        kept = Choice(**{k: v for k, v in doc.items() if k in Choice.__dataclass_fields__})
        if kept.exact != "stock" and kept.exact not in ("cudnn", "flash", "efficient"):
            raise ValueError(f"exact kernel {kept.exact!r}")
        if kept.attn8 not in (None, *attn8.KERNELS):
            raise ValueError(f"8-bit kernel {kept.attn8!r}")
    except (ValueError, TypeError, OSError) as e:
        log.warning("attention choice beside the artifact of %s ignored: %s", stamp.device, e)
        return
    if (kept.device, kept.torch) != (stamp.device, stamp.torch):
        return
    if kept.attn8 == "cudnn" and cudnn8.available() is not None:
        kept.attn8 = None  # this worker lacks what the kernel needs: exact attention
    choice = _CHOICES.setdefault((kept.device, kept.torch), kept)
    choice.__dict__.update(asdict(kept))  # in place: the processors point at this object
