"""The worker-side commands of ``python -m worker`` (torch and diffusers are needed here, so the
producer's CLI hands its process over to them: ``framefleet models …``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from producer.errors import FramefleetError
from producer.settings import get_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker")
    sub = parser.add_subparsers(dest="command", required=True)
    cal = sub.add_parser(
        "calibrate-magcache",
        help="print a model's MagCache ratios (diffusers' calibrate mode), as JSON")
    cal.add_argument("--model", required=True, help="the diffusers folder (path)")
    cal.add_argument("--steps", type=int, default=50, help="denoise steps of the calibration")
    cal.add_argument("--size", default="480x832x81", help="HxWxF of the calibration run")
    cal.add_argument("--prompt", default="a red fox runs through deep snow at dawn")
    cal.add_argument("--guidance", type=float, default=5.0)
    cal.add_argument("--seed", type=int, default=0)
    models = sub.add_parser("models", help="model folders").add_subparsers(
        dest="what", required=True)
    tiny = models.add_parser("tiny", help="write a tiny random Wan pipeline folder")
    tiny.add_argument("path", type=Path)
    tiny.add_argument("--layout", choices=("t2v", "ti2v", "i2v"), default="t2v")
    tiny.add_argument("--seed", type=int, default=0)
    return parser


def _tiny(args: argparse.Namespace) -> int:
    from worker.generate.presets import LAYOUTS, PRESETS, build_pipeline

    path: Path = args.path
    if path.exists() and any(path.iterdir()):
        raise ValueError(f"{path}: exists and is not empty")
    preset = LAYOUTS[args.layout]
    build_pipeline(preset, seed=args.seed).save_pretrained(path)
    h, w, f = PRESETS[preset].default_size
    sys.stdout.write(f"{path}: a tiny random Wan pipeline ({args.layout}, {preset}); random "
                     f"weights: its videos are noise. Sizes: multiples of its VAE x patch, "
                     f"e.g. {w}x{h}, {f} frames\n")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from producer.spec import GenerateSpec
    from worker.devices import resolve_device
    from worker.generate.calibrate import calibrate

    settings = get_settings()
    height, width, frames = (int(v) for v in args.size.split("x"))
    gen = GenerateSpec(model=Path(args.model).absolute().as_uri(), prompt=args.prompt,
                       height=height, width=width, num_frames=frames,
                       num_inference_steps=args.steps, guidance_scale=args.guidance,
                       seed=args.seed)
    ratios = calibrate(gen, settings, resolve_device(settings.device))
    sys.stdout.write(json.dumps({"kind": "mag", "mag_ratios": ratios}) + "\n")
    return 0


def run_command(argv: list[str]) -> int:
    """Run one subcommand; an expected failure is one ``error:`` line and exit status 1."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "calibrate-magcache":
            return _calibrate(args)
        if args.command == "models":
            return _tiny(args)
    except (FramefleetError, ValueError) as e:
        sys.stderr.write("error: " + " ".join(str(e).split()) + "\n")
        return 1
    return 2
