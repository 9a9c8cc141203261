"""Read a job's manifest and check every segment: size, sha256, frame count.

    python examples/read_manifest.py file:///path/to/out/local/job/manifest.json [--pattern]

With ``--pattern`` (jobs of the pattern decoder) it also reads every frame's index back and
checks the video is complete and in order. s3:// manifests use the usual AWS settings.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from producer.spec import Manifest, segment_name
from worker.decoders.pattern import read_frame_index
from worker.pipeline.encode import read_frames_rgb
from worker.stores.storage import read_uri


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest_uri")
    ap.add_argument("--pattern", action="store_true")
    args = ap.parse_args()
    if args.manifest_uri.startswith("file://"):
        # Local paths are confined to FRAMEFLEET_FILE_ROOTS: this tool reads the job's folder.
        folder = Path(unquote(urlparse(args.manifest_uri).path)).parent
        os.environ.setdefault("FRAMEFLEET_FILE_ROOTS", str(folder))
    manifest = Manifest.model_validate_json(read_uri(args.manifest_uri, 16 * 1024**2))
    base = args.manifest_uri.rsplit("/", 1)[0]
    indices: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seg in manifest.segments:
            data = read_uri(f"{base}/{segment_name(seg.index)}", 1024**3)
            ok = len(data) == seg.bytes and hashlib.sha256(data).hexdigest() == seg.sha256
            path = Path(tmp) / f"{seg.index}.mp4"
            path.write_bytes(data)
            frames = read_frames_rgb(path)
            ok = ok and len(frames) == seg.frames
            if args.pattern:
                indices += [read_frame_index(f) for f in frames]
            last = seg.first_frame + seg.frames - 1
            print(f"segment {seg.index}: frames {seg.first_frame}..{last} "
                  f"{'ok' if ok else 'MISMATCH'}")
            if not ok:
                return 1
    if args.pattern and indices != list(range(manifest.frames)):
        print("frame indices are not 0..N-1 in order")
        return 1
    print(f"{manifest.job_id}: {manifest.frames} frames, {len(manifest.segments)} segments, ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
