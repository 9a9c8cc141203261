"""``framefleet models``: model folders for the first minute, before any real weights.

``framefleet models tiny PATH`` writes a tiny random Wan pipeline folder (diffusers layout: a
tiny UMT5 text encoder with a tokenizer made locally, a tiny transformer and VAE, Wan's
scheduler; ``--layout i2v`` adds a tiny CLIP image encoder), with a marker file that makes
every job on it say ``random weights: noise``; ``--lora FILE`` also writes a random LoRA for
it. Building it needs torch and
diffusers, so the command hands its process over to the worker's own entry point, ``python -m
worker models tiny`` (the producer never imports ``worker``). Its videos are noise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from producer.cli.help import plain_typer

models_app = plain_typer(help="Model folders: a tiny random Wan pipeline to try the fleet with.",
                         no_args_is_help=True)
#: The layouts: text to video (Wan2.1), TI2V (Wan2.2 5B: prompt and/or first frame), image to
#: video (Wan2.1 I2V: CLIP image encoder).
LAYOUTS = ("t2v", "ti2v", "i2v")


def tiny_command(path: Path, layout: str = "t2v", seed: int = 0,
                 lora: Path | None = None) -> list[str]:
    """The worker-side command that writes the folder (and the LoRA)."""
    return [sys.executable, "-m", "worker", "models", "tiny", str(path), "--layout", layout,
            "--seed", str(seed), *(["--lora", str(lora)] if lora is not None else [])]


@models_app.command()
def tiny(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="the folder to write")],
    layout: Annotated[str, typer.Option(metavar="LAYOUT", help="t2v | ti2v | i2v")] = "t2v",
    seed: Annotated[int, typer.Option(metavar="N", help="seed of the random weights")] = 0,
    lora: Annotated[Optional[Path], typer.Option(
        metavar="FILE", help="also write a random LoRA for it (FILE.safetensors), for "
        "--lora FILE:SCALE")] = None,
) -> None:
    """Write a tiny random Wan pipeline folder (random weights: its videos are noise, and its
    jobs say so), for ``framefleet submit --model PATH`` or a worker's
    ``FRAMEFLEET_WARMUP_MODEL``; with ``--lora``, a random LoRA that fits it."""
    if layout not in LAYOUTS:
        raise typer.BadParameter(f"one of {', '.join(LAYOUTS)}", param_hint="--layout")
    if lora is not None and lora.suffix != ".safetensors":
        raise typer.BadParameter("the file name must end in .safetensors", param_hint="--lora")
    argv = tiny_command(path.expanduser().absolute(), layout, seed,
                        lora.expanduser().absolute() if lora is not None else None)
    os.execvp(argv[0], argv)
