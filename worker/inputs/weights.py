"""Where a decoder's weights come from: the worker's side of ``producer.wire.weights``.

``resolve_weights`` turns ``DecoderSpec.weights`` into a local folder to load, or None for the
seeded random init that the job asked for by name (``"random"``). A folder is checked here,
before diffusers sees it: a missing folder gets a plain "no such folder" naming the field
(diffusers would take a missing path for a model hub id), and a folder that is not a
diffusers layout says what it lacks. Only safetensors weights are accepted, never pickle.
Loading reads only local files: nothing reaches a model hub.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.spec import RANDOM_WEIGHTS, DecoderSpec
from producer.wire.weights import check_weights
from worker.inputs.tensorfile import HEAD, check_head
from worker.inputs.tree import read_entry, walk
from worker.stores.paths import file_roots, local_folder
from worker.stores.storage import locate

CONFIG = "config.json"
#: One file, or the index of a sharded checkpoint (diffusers' names).
WEIGHT_FILES = ("diffusion_pytorch_model.safetensors",
                "diffusion_pytorch_model.safetensors.index.json")


def resolve_weights(decoder: DecoderSpec, settings: Settings) -> str | None:
    """The local folder to load for ``decoder``, or None (random init, or no model at all).

    Raises ``InvalidJobError`` naming ``decoder.weights`` (fatal: the same spec fails the
    same way on every worker).
    """
    check_weights(decoder)
    if decoder.weights is None or decoder.weights == RANDOM_WEIGHTS:
        return None
    parsed = urlparse(decoder.weights)
    if parsed.scheme != "file":
        raise InvalidJobError(
            f"decoder.weights: only file:// folders are loaded by workers, got "
            f"{decoder.weights!r} (sync s3:// weights to the worker's disk at deployment)"
        )
    # Confined to FRAMEFLEET_FILE_ROOTS like every local path a job names: outside them one
    # refusal whether or not the folder exists; inside, "no such folder" / "not a directory".
    folder = local_folder(locate(decoder.weights, "decoder.weights").path, settings,
                          field="decoder.weights",
                          uri=decoder.weights)
    # Every file of the folder under the roots and regular, the config bounded, before
    # diffusers (which follows links and reads to the end) opens any of them.
    listed = {e.rel: e for e in walk(folder, file_roots(settings), field="decoder.weights",
                                     base=decoder.weights, max_entries=settings.max_model_files)}
    if CONFIG in listed:
        read_entry(listed[CONFIG], settings.max_model_config_bytes, "decoder.weights",
                   decoder.weights, "FRAMEFLEET_MAX_MODEL_CONFIG_BYTES")
    if CONFIG not in listed:
        raise InvalidJobError(
            f"decoder.weights: {folder} has no {CONFIG}: not a diffusers-layout folder "
            f"(expected {CONFIG} + {WEIGHT_FILES[0]})"
        )
    if not any(name in listed for name in WEIGHT_FILES):
        raise InvalidJobError(
            f"decoder.weights: {folder} has no {WEIGHT_FILES[0]} (safetensors only)"
        )
    check_local_config(folder)
    check_weight_files(folder)
    return str(folder)


def check_weight_files(folder: Path) -> None:
    """The weight file, judged by its content (the one rule: ``worker.inputs.tensorfile``)."""
    for name in WEIGHT_FILES[:1]:
        path = folder / name
        if path.is_file():
            with open(path, "rb") as f:  # a regular file (is_file): opening does not block
                check_head(f.read(HEAD), path.stat().st_size, "decoder.weights", str(path))


def check_local_config(folder: Path) -> None:
    """Read the folder's config the way diffusers will, local files only."""
    from diffusers import AutoencoderKLWan

    try:
        AutoencoderKLWan.load_config(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise InvalidJobError(f"decoder.weights: {folder}/{CONFIG} is not readable: {e}") from e
