"""The extra rows of ``bench/generate.py``: an image-to-video job and a LoRA switch."""

from __future__ import annotations

import argparse
from typing import Any


def extras(args: argparse.Namespace, m: Any, doc: dict[str, Any], budget: Any,
           save: Any) -> None:
    """The image-to-video and LoRA rows asked for on this model (none yet)."""
    if args.image == m.name or args.lora == m.name:
        raise SystemExit("--image and --lora come with image and LoRA jobs")
