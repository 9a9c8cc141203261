"""How far a Wan model's positions reach: the largest width, height and frame count it takes.

diffusers' ``WanRotaryPosEmbed`` holds ``rope_max_seq_len`` positions per axis and, in its
forward, cuts ``freqs[:n].view(n, ...)`` for the ``n`` latent patches along frames, height and
width. Over the table, the view fails deep inside the transformer (``RuntimeError: shape
'[33, 1, 1, -1]' is invalid for input of size 128`` for the tiny model at 528 px): the job
ran its text encoder first and failed opaquely. So, per axis, with the VAE's compression
(``scale_factor_spatial`` s, ``scale_factor_temporal`` t) and the transformer's
``patch_size`` (p_t, p_h, p_w)::

    (width // s) // p_w                 <= rope_max_seq_len   ->  width  <= L * p_w * s
    (height // s) // p_h                <= rope_max_seq_len   ->  height <= L * p_h * s
    ((frames - 1) // t + 1) // p_t      <= rope_max_seq_len   ->  frames <= (L * p_t - 1) * t + 1

(the largest values that are also multiples of the size's multiple, ``s * p``, and ``tk+1``
frames). The tiny model (L 32, patch 2, VAE 8 and 4): 512 px and 125 frames. Wan2.1 and
Wan2.2 (L 1024) reach 16384 px and 4093 frames, far beyond any other limit.

Pure arithmetic on the folder's two config files, read by the worker before the model loads
(``worker.generate.request``) and by the gateway before anything is queued
(``producer.api.reach``): one rule, one message naming the field and the largest value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from producer.errors import InvalidJobError

#: diffusers' defaults when a config leaves a key out (WanTransformer3DModel, AutoencoderKLWan).
DEFAULT_SEQ_LEN, DEFAULT_PATCH, DEFAULT_SPATIAL, DEFAULT_TEMPORAL = 1024, (1, 2, 2), 8, 4


@dataclass(frozen=True)
class Reach:
    """The largest width, height and frame count a model's positions cover, and why."""

    width: int
    height: int
    frames: int
    seq_len: int
    patch: tuple[int, int, int]
    spatial: int
    temporal: int

    def why(self, axis: str) -> str:
        if axis == "frames":
            return (f"its rope_max_seq_len {self.seq_len} latent frames x patch "
                    f"{self.patch[0]}, {self.temporal} frames each")
        p = self.patch[1] if axis == "height" else self.patch[2]
        return f"its rope_max_seq_len {self.seq_len} positions x patch {p} x VAE {self.spatial}"


def _whole(config: Mapping[str, Any], key: str, default: Any) -> Any:
    value = config.get(key, default)
    return default if value is None else value


def reach(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> Reach:
    """The reach of a model from its transformer's and VAE's ``config.json`` (parsed);
    ``ValueError`` when a number is not a positive integer."""
    seq = _whole(transformer, "rope_max_seq_len", DEFAULT_SEQ_LEN)
    patch = tuple(_whole(transformer, "patch_size", DEFAULT_PATCH))
    spatial = _whole(vae, "scale_factor_spatial", DEFAULT_SPATIAL)
    temporal = _whole(vae, "scale_factor_temporal", DEFAULT_TEMPORAL)
    numbers = (seq, *patch, spatial, temporal)
    if len(patch) != 3 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                  for n in numbers):
        raise ValueError(f"not positive integers: rope_max_seq_len {seq}, patch_size {patch}, "
                         f"VAE factors {spatial}, {temporal}")
    p_t, p_h, p_w = patch
    return Reach(width=seq * p_w * spatial, height=seq * p_h * spatial,
                 frames=(seq * p_t - 1) * temporal + 1, seq_len=seq,
                 patch=(p_t, p_h, p_w), spatial=spatial, temporal=temporal)


def check_reach(r: Reach, width: int, height: int, frames: int,
                fields: tuple[str, str, str]) -> None:
    """An ``InvalidJobError`` naming the first of ``fields`` (width, height, frames) over the
    model's reach, with the largest value it takes."""
    for field, axis, value, most in ((fields[0], "width", width, r.width),
                                     (fields[1], "height", height, r.height),
                                     (fields[2], "frames", frames, r.frames)):
        if value > most:
            raise InvalidJobError(f"{field}: {axis} {value} is over this model's reach: at "
                                  f"most {most} ({r.why(axis)})")
