"""Stream-decode a latents file to MP4 segments on this machine, without any server.

    python examples/stream_decode.py latents.npy out/ --weights DIR|random [--preset tiny|wan2.1]
    python examples/stream_decode.py latents.npy out/ --decoder pattern

``--weights`` is a diffusers-layout folder of the Wan VAE (see the README), or ``random`` for
a seeded random init, which decodes to noise (the output says so).

Uses the same runner a worker uses (file:// output), so ``out/`` gets the segments and the
manifest exactly as a fleet job would write them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from producer.spec import JobSpec
from worker.run import default_decoders, run_job


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("latents", type=Path, help=".npy or .safetensors, (16, T, h, w)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", default="wan2.1", choices=["wan2.1", "tiny"])
    ap.add_argument("--weights", help="diffusers-layout folder of the Wan VAE, or 'random'")
    ap.add_argument("--decoder", default="wan2.1-vae", choices=["wan2.1-vae", "pattern"])
    args = ap.parse_args()
    # Local paths are confined to FRAMEFLEET_FILE_ROOTS: this tool may use the folders named
    # on its command line.
    args.out.mkdir(parents=True, exist_ok=True)
    named = [args.latents, args.out]
    if args.weights not in (None, "random"):
        named.append(Path(args.weights))
    os.environ.setdefault("FRAMEFLEET_FILE_ROOTS",
                          ":".join(str(p.absolute().parent if p.is_file() else p.absolute())
                                   for p in named))
    decoder = {"name": args.decoder, "preset": args.preset}
    if args.weights == "random":
        decoder["weights"] = "random"
    elif args.weights is not None:
        decoder["weights"] = Path(args.weights).absolute().as_uri()
    spec = JobSpec.model_validate({
        "job_id": args.latents.stem, "tenant": "local",
        "input": {"uri": args.latents.absolute().as_uri()},
        "decoder": decoder,
        "output": {"uri": args.out.absolute().as_uri()},
    })
    result = run_job(spec, default_decoders())
    t = result.timings
    m = result.manifest
    print(f"{m.frames} frames {m.width}x{m.height} -> {result.manifest_uri}")
    print(f"wall {t.wall_s:.2f} s: decode {t.decode_s:.2f} s, encode {t.encode_s:.2f} s")
    if result.random_weights:
        print("random weights: the frames are noise (--weights random)")


if __name__ == "__main__":
    main()
