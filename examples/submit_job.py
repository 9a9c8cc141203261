"""Submit one job to a running fleet and wait for it with a progress bar.

    FRAMEFLEET_BROKER_URL=redis://127.0.0.1:6379/0 \
    python examples/submit_job.py s3://bucket/latents/clip.safetensors s3://bucket/videos \
        --weights models/wan2.1/vae

``--weights`` is the Wan VAE's diffusers-layout folder on the workers (see the README), or
``random`` for seeded random weights, which decode to noise.

The Wan VAE decode takes seconds on a GPU worker and many minutes on a CPU one (81 frames at
480x832 ran 765 s): a CPU worker says so before it starts (``warning: this CPU worker
estimates …`` above the bar, and in its log). To try the example on a CPU, give it small
latents, such as the quickstart's (16 x 13 x 30 x 52: 49 frames of 240x416).
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

from producer.client import Client
from producer.spec import JobSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input_uri", help="latents: s3://bucket/key or file:///path")
    ap.add_argument("output_uri", help="output prefix: s3://bucket/prefix or file:///path")
    ap.add_argument("--weights", required=True, help="weights folder on the workers, or 'random'")
    args = ap.parse_args()
    weights = args.weights if args.weights == "random" else Path(args.weights).absolute().as_uri()
    spec = JobSpec.model_validate({
        "job_id": f"example-{uuid.uuid4().hex[:8]}",
        "tenant": "examples",
        "input": {"uri": args.input_uri},
        "decoder": {"name": "wan2.1-vae", "weights": weights},
        "output": {"uri": args.output_uri},
        "video": {"fps": 16, "segment_frames": 48},
    })
    handle = Client().submit(spec)
    result = handle.wait(progress=True)
    m = result.manifest
    print(f"{m.frames} frames in {len(m.segments)} segments: {result.manifest_uri}")
    if result.random_weights:
        print("random weights: the frames are noise")
    if result.cost is not None:
        print(f"cost ${result.cost.total_usd:.6f} (${result.cost.usd_per_video_minute:.4f}/min)")


if __name__ == "__main__":
    main()
