"""``framefleet compile``: compile artifacts for a model folder, once per release.

Compiling needs torch and diffusers, so the command hands its process over to the worker's
own entry point, ``python -m worker compile`` (``worker.generate.model.compiler``), as
``framefleet models`` does: the producer never imports ``worker``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer


def compile_command(model: Path, tiers: str, sizes: str, out: str | None) -> list[str]:
    """The worker-side command line."""
    return [sys.executable, "-m", "worker", "compile", "--model", str(model), "--tiers", tiers,
            "--sizes", sizes, *(["--out", out] if out else [])]


def compile(
    model: Annotated[Path, typer.Option(metavar="DIR", help="the diffusers model folder")],
    sizes: Annotated[str, typer.Option(
        metavar="SIZES", help="comma-separated HxWxF video sizes, e.g. 704x1280x121,480x832x81")],
    tiers: Annotated[str, typer.Option(
        metavar="TIERS", help="comma-separated: exact, fp8")] = "exact",
    out: Annotated[Optional[str], typer.Option(
        metavar="DIR|s3://BUCKET/PREFIX",
        help="where the artifacts and index.json go (default: DIR/compiled/)")] = None,
) -> None:
    """Compile a model folder at each tier and size, as a worker's warm-up does, and write
    one compile artifact per tier with an index.json saying what each covers (model config,
    tier, sizes, torch, triton, device). A worker whose FRAMEFLEET_WARMUP_MODEL is this
    folder (or whose FRAMEFLEET_COMPILE_ARTIFACTS is OUT) loads the matching artifacts before
    its warm-up and compiles nothing they cover. Run it once per release on the GPU kind the
    fleet runs: an artifact is valid for one torch + Triton version and one GPU name."""
    if out is not None and not out.startswith("s3://"):
        out = str(Path(out).expanduser().absolute())
    argv = compile_command(model.expanduser().absolute(), tiers, sizes, out)
    os.execvp(argv[0], argv)
