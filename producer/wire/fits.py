"""Whether a generate request fits its model and the fleet's limits: one check that names
every field at fault.

The same code runs in three places. The client and the CLI run it at submit where this host
sees the model's folder (``producer.wire.rules.check_local_files``). The gateway runs it
before it queues anything (``producer.api.submit``). The worker runs it on receipt, before its
model loads (``worker.generate.request``). A request that does not fit is refused before
anything is queued wherever the folder can be read, instead of a job that a worker fails a
moment later.

What it needs of the model is what two of its configs say (``Reach``): the VAE's compression
and the transformer's patch give the sizes' multiple, the frames' step, and how far the rotary
positions reach. What it needs of the fleet is three numbers (``Limits``:
``FRAMEFLEET_MAX_DENOISE_STEPS``, ``FRAMEFLEET_MAX_FRAMES``, ``FRAMEFLEET_MAX_PIXELS``).
Every fault is found before one is raised: ``40x40`` for a model of multiple 32 names the
width and the height, and steps over the limit are named beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from producer.errors import InvalidJobError
from producer.wire.generation import GenerateSpec
from producer.wire.layouts import read_json
from producer.wire.reach import Reach, reach


@dataclass(frozen=True)
class Limits:
    """The fleet's limits on one generate job (the settings of whoever checks)."""

    steps: int  # FRAMEFLEET_MAX_DENOISE_STEPS
    frames: int  # FRAMEFLEET_MAX_FRAMES
    pixels: int  # FRAMEFLEET_MAX_PIXELS


@dataclass(frozen=True)
class Names:
    """What a request calls each quantity: a refusal names the request's own fields."""

    width: str = "generate.width"
    height: str = "generate.height"
    frames: str = "generate.num_frames"
    steps: str = "generate.num_inference_steps"


#: The ``generate`` block of a JobSpec.
GENERATE = Names()


def multiples(model: Reach) -> tuple[int, int]:
    """(width, height) must be multiples of these: the VAE's compression x the patch."""
    return model.spatial * model.patch[2], model.spatial * model.patch[1]


def faults(width: int, height: int, frames: int, steps: int, model: Reach | None,
           limits: Limits, names: Names = GENERATE) -> list[str]:
    """Every fault of a request, each ``field: why``, in the request's order; empty: it fits.
    ``model`` None: the model's folder is not readable here, only the fleet's limits apply."""
    found = []
    if steps > limits.steps:
        found.append(f"{_at(names.steps, 'steps')}{steps} exceeds the limit of {limits.steps} "
                     "(FRAMEFLEET_MAX_DENOISE_STEPS)")
    frames_at = _at(names.frames, "frames")
    if model is not None and (frames - 1) % model.temporal:
        found.append(f"{frames_at}must be {model.temporal}k+1 for this model, got {frames}")
    elif frames > limits.frames:
        found.append(f"{frames_at}{frames} exceeds the limit of {limits.frames} "
                     "(FRAMEFLEET_MAX_FRAMES)")
    elif model is not None and frames > model.frames:
        found.append(_over(names.frames, "frames", frames, model))
    if model is not None:
        for field, axis, value, multiple, most in (
                (names.width, "width", width, multiples(model)[0], model.width),
                (names.height, "height", height, multiples(model)[1], model.height)):
            if value % multiple:
                found.append(f"{_at(field, axis)}{value} is not a multiple of {multiple} (the "
                             f"VAE's {model.spatial} x the transformer's patch) for this model")
            elif value > most:
                found.append(_over(field, axis, value, model))
    if width * height > limits.pixels:
        both = names.height if names.height == names.width else f"{names.height}, {names.width}"
        found.append(f"{both}: {width}x{height} exceeds the limit of {limits.pixels} pixels "
                     "(FRAMEFLEET_MAX_PIXELS)")
    return found


def _at(field: str, quantity: str) -> str:
    """``generate.width: ``, or ``size: width `` where the field names more than one."""
    return f"{field}: " if field.endswith(quantity) else f"{field}: {quantity} "


def _over(field: str, axis: str, value: int, model: Reach) -> str:
    most = {"width": model.width, "height": model.height, "frames": model.frames}[axis]
    return (f"{field}: {axis} {value} is over this model's reach: at most {most} "
            f"({model.why(axis)})")


def check_fits(gen: GenerateSpec, model: Reach | None, limits: Limits,
               names: Names = GENERATE) -> None:
    """``InvalidJobError`` naming every field of ``gen`` at fault (``faults``), one
    ``field: why`` after another, separated by ``; ``."""
    found = faults(gen.width, gen.height, gen.num_frames, gen.num_inference_steps, model,
                   limits, names)
    if found:
        raise InvalidJobError("; ".join(found))


#: The two configs the check reads of a model's folder.
CONFIGS = ("transformer/config.json", "vae/config.json")


def read_reach(folder: Path) -> Reach | None:
    """The ``Reach`` of the diffusers folder ``folder`` from its two small configs (bounded
    reads, no weights), or None where they cannot be read or make no sense: the worker reads
    the folder itself and names what is wrong with it."""
    try:
        return reach(*(read_json(folder / name) for name in CONFIGS))
    except (OSError, ValueError, TypeError, RecursionError):
        return None
