"""Hostile model folders: a copy of a tiny Wan folder with one thing made to hurt a loader.

Each attack takes the copy and a folder outside the worker's roots, changes the copy, and
returns the file the refusal must name (relative to the model folder).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _config(model: Path, rel: str, **values: Any) -> str:
    path = model / rel
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))
    return rel


def zero_vae_config(model: Path, outside: Path) -> str:
    """``vae/config.json`` → ``/dev/zero``: an endless read."""
    (model / "vae/config.json").unlink()
    (model / "vae/config.json").symlink_to("/dev/zero")
    return "vae/config.json"


def fifo_scheduler_config(model: Path, outside: Path) -> str:
    """``scheduler/scheduler_config.json`` as a FIFO: ``open`` blocks until a writer comes."""
    (model / "scheduler/scheduler_config.json").unlink()
    os.mkfifo(model / "scheduler/scheduler_config.json")
    return "scheduler/scheduler_config.json"


def outside_transformer(model: Path, outside: Path) -> str:
    """``transformer/`` a symlink to a folder outside the roots (which holds a real one)."""
    target = outside / f"transformer-of-{model.name}"
    shutil.move(model / "transformer", target)
    (model / "transformer").symlink_to(target, target_is_directory=True)
    return "transformer"


def outside_model_index(model: Path, outside: Path) -> str:
    """``model_index.json`` a symlink to a real one outside the roots."""
    target = outside / f"model_index-of-{model.name}.json"
    shutil.move(model / "model_index.json", target)
    (model / "model_index.json").symlink_to(target)
    return "model_index.json"


def huge_transformer(model: Path, outside: Path) -> str:
    return _config(model, "transformer/config.json", num_layers=100_000)


def huge_text_encoder(model: Path, outside: Path) -> str:
    return _config(model, "text_encoder/config.json", num_layers=100_000)


def huge_rope(model: Path, outside: Path) -> str:
    return _config(model, "transformer/config.json", rope_max_seq_len=1e7)


def torch_saved_transformer(model: Path, outside: Path) -> str:
    """The transformer's weights as ``torch.save`` writes them (a zip of pickles)."""
    from safetensors.torch import load_file

    folder = model / "transformer"
    state = load_file(folder / "diffusion_pytorch_model.safetensors")
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    torch.save(state, folder / "diffusion_pytorch_model.bin")
    return "transformer/diffusion_pytorch_model.bin"


def pickled_text_encoder(model: Path, outside: Path) -> str:
    """The text encoder's weights as a plain pickle (``torch.save``'s legacy format)."""
    from safetensors.torch import load_file

    folder = model / "text_encoder"
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    return "text_encoder/pytorch_model.bin"


def zip_named_safetensors(model: Path, outside: Path) -> str:
    """A ``torch.save`` zip under the safetensors name."""
    from safetensors.torch import load_file

    path = model / "vae/diffusion_pytorch_model.safetensors"
    state = {k: v.clone() for k, v in load_file(path).items()}  # not the mapped file's pages
    path.unlink()
    torch.save(state, path)
    return "vae/diffusion_pytorch_model.safetensors"


Attack = Callable[[Path, Path], str]
#: name → (attack, words its refusal must hold besides the field and the file)
ATTACKS: dict[str, tuple[Attack, str]] = {
    "dev-zero vae config": (zero_vae_config, "FRAMEFLEET_FILE_ROOTS"),
    "fifo scheduler config": (fifo_scheduler_config, "not a regular file"),
    "transformer folder outside": (outside_transformer, "FRAMEFLEET_FILE_ROOTS"),
    "model_index.json outside": (outside_model_index, "FRAMEFLEET_FILE_ROOTS"),
    "100000 transformer layers": (huge_transformer, "FRAMEFLEET_MAX_MODEL_LAYERS"),
    "100000 text encoder layers": (huge_text_encoder, "FRAMEFLEET_MAX_TEXT_LAYERS"),
    "rope_max_seq_len 1e7": (huge_rope, "FRAMEFLEET_MAX_MODEL_SEQ_LEN"),
    "torch.save transformer": (torch_saved_transformer, "pickle or zip checkpoint"),
    "pickled text encoder": (pickled_text_encoder, "pickle or zip checkpoint"),
    "zip named .safetensors": (zip_named_safetensors, "pickle or zip checkpoint"),
}


def attacked(model: Path, where: Path, outside: Path, name: str) -> tuple[Path, str]:
    """A copy of ``model`` at ``where`` with attack ``name``; (the copy, the file it names)."""
    copy = Path(shutil.copytree(model, where, symlinks=True))
    return copy, ATTACKS[name][0](copy, outside)
