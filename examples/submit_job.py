"""Submit one job to a running fleet and wait for it with a progress bar.

    FRAMEFLEET_BROKER_URL=redis://127.0.0.1:6379/0 \
    python examples/submit_job.py s3://bucket/latents/clip.safetensors s3://bucket/videos
"""

from __future__ import annotations

import sys
import uuid

from producer.client import Client
from producer.spec import JobSpec


def main(input_uri: str, output_uri: str) -> None:
    spec = JobSpec.model_validate({
        "job_id": f"example-{uuid.uuid4().hex[:8]}",
        "tenant": "examples",
        "input": {"uri": input_uri},
        "output": {"uri": output_uri},
        "video": {"fps": 16, "segment_frames": 48},
    })
    handle = Client().submit(spec)
    result = handle.wait(progress=True)
    m = result.manifest
    print(f"{m.frames} frames in {len(m.segments)} segments: {result.manifest_uri}")
    if result.cost is not None:
        print(f"cost ${result.cost.total_usd:.6f} (${result.cost.usd_per_video_minute:.4f}/min)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
