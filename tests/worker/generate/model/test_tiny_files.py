"""What ``framefleet models tiny`` writes is readable by every user (a worker in another
user's container reads it) and its LoRA records the layout it was made for."""

from __future__ import annotations

import stat
from pathlib import Path

from safetensors import safe_open

from producer.wire.layouts import LORA_MADE_FOR
from worker.generate.model.tiny import write_tiny


def test_the_tiny_model_and_its_lora_are_0644_and_the_lora_names_its_layout(
        tmp_path: Path) -> None:
    lora = tmp_path / "loras" / "tiny.safetensors"
    write_tiny(tmp_path / "model", "t2v", lora=lora)
    files = [p for p in (tmp_path / "model").rglob("*") if p.is_file()] + [lora]
    weights = [p for p in files if p.suffix == ".safetensors"]
    assert len(weights) >= 4, weights  # transformer, vae, text encoder, the LoRA
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in files}
    assert set(modes.values()) == {0o644}, modes
    with safe_open(str(lora), "pt") as f:
        assert (f.metadata() or {}).get(LORA_MADE_FOR) == "t2v"
