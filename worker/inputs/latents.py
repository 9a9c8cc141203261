"""Loading latents: ``.safetensors`` and ``.npy`` only — never pickle, never torch.load.

Every check names the file and what is wrong with it; all of them are fatal (no retry).
A ``file://`` input must lie under FRAMEFLEET_FILE_ROOTS, be a regular file and hold at most
``max_input_bytes`` (counted while reading: ``worker/stores/paths.py``).
"""

from __future__ import annotations

import io

import numpy as np
import torch

from producer.errors import InputTooLarge, InvalidJobError
from producer.settings import Settings
from producer.wire.spec import InputSpec
from worker.decoders.base import SPATIAL_RATIO, frames_for_latents
from worker.memory import over_room, room_bytes
from worker.stores.storage import read_uri

FLOAT_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def parse_latents(data: bytes, spec: InputSpec) -> torch.Tensor:
    """Bytes → tensor, by the declared/inferred format; refuses pickles and object arrays."""
    fmt = spec.resolved_format
    if fmt == "npy":
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as e:
            raise InvalidJobError(f"input {spec.uri}: not a plain .npy array ({e})") from None
        except Exception as e:  # noqa: BLE001 - numpy raises many kinds on garbage
            raise InvalidJobError(f"input {spec.uri}: unreadable .npy: {e}") from None
        if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
            raise InvalidJobError(
                f"input {spec.uri}: latents must be a float array, got {array.dtype}"
            )
        return torch.from_numpy(np.ascontiguousarray(array))
    from safetensors import SafetensorError
    from safetensors.torch import load as load_safetensors

    try:
        tensors = load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise InvalidJobError(f"input {spec.uri}: corrupt safetensors file: {e}") from None
    if spec.tensor is not None:
        if spec.tensor not in tensors:
            raise InvalidJobError(
                f"input.tensor: {spec.tensor!r} not in {spec.uri} (has {sorted(tensors)})"
            )
        return tensors[spec.tensor]
    if len(tensors) != 1:
        raise InvalidJobError(
            f"input.tensor: {spec.uri} holds {len(tensors)} tensors {sorted(tensors)}; name one"
        )
    return next(iter(tensors.values()))


def check_latents(
    latents: torch.Tensor, spec: InputSpec, channels: int, settings: Settings
) -> torch.Tensor:
    """Shape, dtype, values and size limits; returns (C, T, h, w) float32."""
    where = f"input {spec.uri}"
    if latents.dtype not in FLOAT_DTYPES:
        raise InvalidJobError(f"{where}: latents dtype {latents.dtype} is not floating point")
    if latents.ndim == 5:
        if latents.shape[0] != 1:
            raise InvalidJobError(f"{where}: batch of {latents.shape[0]}; one video per job")
        latents = latents[0]
    if latents.ndim != 4:
        raise InvalidJobError(
            f"{where}: latents must have rank 4 (C, T, H, W) or 5 (1, C, T, H, W), "
            f"got shape {tuple(latents.shape)}"
        )
    c, t, h, w = latents.shape
    if c != channels:
        raise InvalidJobError(f"{where}: {c} latent channels, the decoder expects {channels}")
    if t == 0 or h == 0 or w == 0:
        raise InvalidJobError(f"{where}: empty latents, shape {tuple(latents.shape)}")
    frames = frames_for_latents(t)
    if frames > settings.max_frames:
        raise InvalidJobError(
            f"{where}: {frames} frames exceed the limit of {settings.max_frames}"
        )
    pixels = h * w * SPATIAL_RATIO * SPATIAL_RATIO
    if pixels > settings.max_pixels:
        raise InvalidJobError(
            f"{where}: frames of {w * SPATIAL_RATIO}x{h * SPATIAL_RATIO} exceed the limit of "
            f"{settings.max_pixels} pixels"
        )
    latents = latents.float()
    if not bool(torch.isfinite(latents).all()):
        raise InvalidJobError(f"{where}: latents contain NaN or Inf")
    return latents


#: A latents file is held about three times while it is parsed: the bytes read, the array
#: ``np.load`` makes of them, the float32 tensor.
PARSE_COPIES = 3
#: A file this small is read whatever the room left: it cannot send the process to the OOM
#: killer, and the guard's own polls stop a process that is over its limit already.
READ_FLOOR = 64 * 2**20


def load_latents(spec: InputSpec, channels: int, settings: Settings) -> torch.Tensor:
    """The job's latents, read under ``FRAMEFLEET_MAX_INPUT_BYTES`` and, when the memory guard
    is on, under what this process may still hold: a file too big for it is refused before it
    is read (a fatal error naming ``input.uri`` and the limit), not read into the OOM killer."""
    room = room_bytes(settings)
    cap = settings.max_input_bytes
    held = cap if room is None else max(room // PARSE_COPIES, READ_FLOOR)
    if held >= cap:
        data = read_uri(spec.uri, cap, settings, field="input.uri")
    else:
        try:
            data = read_uri(spec.uri, held, settings, field="input.uri")
        except InputTooLarge:
            raise over_room(settings, f"input.uri: {spec.uri}", held) from None
    return check_latents(parse_latents(data, spec), spec, channels, settings)
