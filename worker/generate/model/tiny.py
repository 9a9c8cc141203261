"""``framefleet models tiny``: a tiny random Wan pipeline folder, labelled as random, and a
random LoRA that fits it: everything the README's first-minute examples use, no download.

The folder carries :data:`RANDOM_MARKER`, which the model folder reader
(``worker.generate.request.folder.read_model``) finds, so every job on it says ``random weights:
noise`` in its manifest, its result, the CLI and the API, as a job on ``decoder.weights
"random"`` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from producer.wire.layouts import LORA_MADE_FOR

#: The marker file of a folder of random weights (its presence is what counts; the content
#: says who wrote it and how).
RANDOM_MARKER = "framefleet_random_weights.json"
#: The linear layers of each attention block a tiny LoRA adapts.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def write_tiny(path: Path, layout: str, seed: int = 0, lora: Path | None = None) -> str:
    """Write the pipeline (``layout``: t2v, ti2v or i2v), its marker and, with ``lora``, a
    random LoRA for its transformer; returns the preset's name."""
    from worker import quiet
    from worker.generate.model.presets import LAYOUTS, build_pipeline

    quiet.progress_bars_off()
    if path.exists() and any(path.iterdir()):
        raise ValueError(f"{path}: exists and is not empty")
    if lora is not None and lora.suffix != ".safetensors":
        raise ValueError(f"--lora: {lora}: the file name must end in .safetensors")
    preset = LAYOUTS[layout]
    pipe = build_pipeline(preset, seed=seed)
    pipe.save_pretrained(path)
    (path / RANDOM_MARKER).write_text(json.dumps({
        "random_weights": True, "written_by": "framefleet models tiny", "preset": preset,
        "seed": seed, "note": "seeded random weights: the videos of this model are noise"},
        indent=2) + "\n")
    if lora is not None:
        write_lora(pipe.transformer, lora, seed, made_for=layout)
    readable(path)
    return preset


def readable(path: Path) -> None:
    """Make the files under ``path`` (or ``path`` itself) 0644. safetensors writes through a
    0600 temporary file, and a worker in another user's container could not read a model or
    LoRA made here."""
    for f in [path] if path.is_file() else (p for p in path.rglob("*") if p.is_file()):
        f.chmod(0o644)


def write_lora(transformer: Any, path: Path, seed: int = 0, rank: int = 4,
               made_for: str | None = None) -> Path:
    """A random LoRA of ``rank`` on ``transformer``'s attention projections, in diffusers'
    format (``transformer.``-prefixed ``lora_A``/``lora_B`` weights), as ``.safetensors``
    readable by all (0644). ``made_for`` (a layout: t2v, ti2v, i2v) is recorded in the file's
    metadata as :data:`LORA_MADE_FOR`. ``transformer`` is left as it was."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model_state_dict
    from safetensors.torch import save_file

    model = copy.deepcopy(transformer)  # add_adapter changes the module in place
    state = torch.random.get_rng_state()
    torch.manual_seed(seed + 2)
    try:
        model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(LORA_TARGETS),
                                     init_lora_weights=False))
    finally:
        torch.random.set_rng_state(state)
    tensors = get_peft_model_state_dict(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({f"transformer.{k}": v.contiguous() for k, v in tensors.items()}, str(path),
              metadata={LORA_MADE_FOR: made_for} if made_for else None)
    readable(path)
    return path
