"""The worker-side commands of ``python -m worker`` (torch and diffusers are needed here, so the
producer's CLI hands its process over to them: ``framefleet models …``, ``framefleet
compile …``)."""

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
    comp = sub.add_parser(
        "compile", prog="framefleet compile",
        help="compile a model at its tiers and sizes; write its compile artifacts",
        description="Compile a model folder at each tier and size, as a worker's warm-up "
        "does, and write one compile artifact per tier (torch.compiler's portable caches) "
        "with an index.json saying what each covers (model config, tier, sizes, torch, "
        "triton, device). A worker whose FRAMEFLEET_WARMUP_MODEL is this folder loads the "
        "artifacts that match it before its warm-up, and compiles nothing they cover. Run "
        "it once per release on the GPU kind the fleet runs: an artifact is valid for one "
        "torch + Triton version and one GPU name.")
    comp.add_argument("--model", required=True, metavar="DIR",
                      help="the diffusers model folder (path)")
    comp.add_argument("--tiers", default="exact", metavar="TIERS",
                      help="comma-separated: exact, fp8 (default: exact)")
    comp.add_argument("--sizes", required=True, metavar="SIZES",
                      help="comma-separated HxWxF video sizes, e.g. 704x1280x121,480x832x81")
    comp.add_argument("--out", default=None, metavar="DIR|s3://BUCKET/PREFIX",
                      help="where the artifacts and index.json go (default: DIR/compiled/)")
    models = sub.add_parser("models", help="model folders").add_subparsers(
        dest="what", required=True)
    tiny = models.add_parser("tiny", help="write a tiny random Wan pipeline folder")
    tiny.add_argument("path", type=Path)
    tiny.add_argument("--layout", choices=("t2v", "ti2v", "i2v"), default="t2v")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--lora", type=Path, default=None,
                      help="also write a random LoRA for it (.safetensors)")
    return parser


def _tiny(args: argparse.Namespace) -> int:
    from worker.generate.model.presets import PRESETS
    from worker.generate.model.tiny import write_tiny

    path: Path = args.path
    preset = write_tiny(path, args.layout, args.seed, args.lora)
    h, w, f = PRESETS[preset].default_size
    sys.stdout.write(f"{path}: a tiny random Wan pipeline ({args.layout}, {preset}); random "
                     f"weights: noise. Sizes: multiples of its VAE x patch, e.g. {w}x{h}, "
                     f"{f} frames\n")
    if args.lora is not None:
        sys.stdout.write(f"{args.lora}: a random LoRA for it (random weights: noise)\n")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from producer.wire.spec import GenerateSpec
    from worker.devices import resolve_device
    from worker.generate.tier.calibrate import calibrate

    settings = get_settings()
    height, width, frames = (int(v) for v in args.size.split("x"))
    gen = GenerateSpec(model=Path(args.model).absolute().as_uri(), prompt=args.prompt,
                       height=height, width=width, num_frames=frames,
                       num_inference_steps=args.steps, guidance_scale=args.guidance,
                       seed=args.seed)
    ratios = calibrate(gen, settings, resolve_device(settings.device))
    sys.stdout.write(json.dumps({"kind": "mag", "mag_ratios": ratios}) + "\n")
    return 0


def _compile(args: argparse.Namespace) -> int:
    from worker import quiet
    from worker.devices import resolve_device
    from worker.generate.model.compiler import compile_model, describe

    quiet.progress_bars_off()
    settings = get_settings()
    tiers = [t for t in args.tiers.split(",") if t]
    bad = [t for t in tiers if t not in ("exact", "fp8")]
    if bad or not tiers:
        raise ValueError(f"--tiers: {','.join(bad) or 'none'}: give exact and/or fp8")
    model = str(Path(args.model).expanduser().absolute())
    rows = compile_model(model, tiers, args.sizes, args.out, settings,
                         resolve_device(settings.device))
    sys.stdout.write(describe(rows, args.out or Path(model) / "compiled") + "\n")
    return 0


def run_command(argv: list[str]) -> int:
    """Run one subcommand; an expected failure is one ``error:`` line and exit status 1."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "calibrate-magcache":
            return _calibrate(args)
        if args.command == "models":
            return _tiny(args)
        if args.command == "compile":
            return _compile(args)
    except (FramefleetError, ValueError) as e:
        sys.stderr.write("error: " + " ".join(str(e).split()) + "\n")
        return 1
    return 2
