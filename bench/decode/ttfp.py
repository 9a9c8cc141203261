"""Time to first playable segment: from a job's start to its first segment in ``index.m3u8``.

Runs jobs through the runner (the code a worker's task calls) on a warmed decoder and
records, per job, when the first segment joined the live playlist (the moment the playlist
that lists it was uploaded: ``Run.segment_hooks``), with and without a short first
segment (``video.first_segment_frames``). The queue's part (``Client.submit`` to the task
starting on an idle worker) is measured by bench/fleet/queue_bench.py on a real Redis; add it.

  python bench/decode/ttfp.py --device cuda --sizes 832x480,1280x720 --frames 81 --reps 3 \
      --first 0,1,5 --out bench/results/ttfp-h200.json
  python bench/decode/ttfp.py --device cpu --preset tiny --sizes 256x160 --frames 33 --reps 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.report import device_report, write_json
from producer.settings import Settings
from producer.wire.spec import (
    DecoderSpec,
    InputSpec,
    JobSpec,
    OutputSpec,
    Progress,
    SegmentInfo,
    VideoSpec,
)
from worker.run import DecoderCache, Run, run_job
from worker.sinks.hls import PLAYLIST


def one_job(cache: DecoderCache, decoder: DecoderSpec, latents: Path, out: Path, job_id: str,
            first: int | None, segment_frames: int) -> dict[str, Any]:
    spec = JobSpec(
        job_id=job_id, input=InputSpec(uri=latents.as_uri()), decoder=decoder,
        video=VideoSpec(fps=16, segment_frames=segment_frames, first_segment_frames=first),
        output=OutputSpec(uri=out.as_uri()),
    )
    listed: list[tuple[float, SegmentInfo]] = []
    lock = threading.Lock()

    def segment_landed(seg: SegmentInfo, progress: Progress) -> None:
        with lock:
            listed.append((time.perf_counter(), seg))

    t0 = time.perf_counter()
    run = Run(spec, segment_hooks=[segment_landed],
              settings=Settings(file_roots=str(latents.parent)))
    result = run_job(spec, cache, run)
    wall = time.perf_counter() - t0
    # Correctness first: the playlist listed every segment once, in order, and ended
    assert [s.index for _, s in listed] == list(range(len(result.manifest.segments))), listed
    playlist = (out / spec.tenant / spec.job_id / PLAYLIST).read_text()
    assert playlist.endswith("#EXT-X-ENDLIST\n") and playlist.count("#EXTINF") == len(listed)
    first_at, first_seg = listed[0]
    return {
        "ttfp_s": first_at - t0,
        "first_segment_frames": first_seg.frames,
        "first_segment_bytes": first_seg.bytes,
        "wall_s": wall,
        "load_s": result.timings.load_s,
        "frames": result.manifest.frames,
        "segments": len(result.manifest.segments),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", default="832x480,1280x720", help="WxH list")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--first", default="0,1,5",
                   help="first_segment_frames values to try; 0: none (segment_frames)")
    p.add_argument("--segment-frames", type=int, default=48)
    p.add_argument("--decoder", default="wan2.1-vae", choices=["wan2.1-vae", "pattern"])
    p.add_argument("--preset", default="wan2.1", choices=["wan2.1", "tiny"])
    p.add_argument("--graphs", type=int, default=2, help="compiled decode graphs (CUDA)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    device = torch.device(args.device)
    cache = DecoderCache(device, graphs=args.graphs if device.type == "cuda" else 0)
    # random weights, by name: the timing depends on the architecture, not on the weights
    decoder = DecoderSpec(name=args.decoder, preset=args.preset,
                          weights="random" if args.decoder != "pattern" else None)
    firsts = [int(v) or None for v in args.first.split(",")]
    report: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        **device_report(device),
        "decoder": f"{args.decoder} ({args.preset})",
        "graphs": cache.graphs,
        "store": "file:// (local disk)",
        "segment_frames": args.segment_frames,
        "runs": [],
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            t = (args.frames - 1) // 4 + 1
            latents = root / f"z-{size}.npy"
            z = np.random.default_rng(0).standard_normal((16, t, h // 8, w // 8), np.float32)
            np.save(latents, z)
            t0 = time.perf_counter()
            cache.get(decoder).warmup(h // 8, w // 8)  # compile + capture: not a job's cost
            warmup_s = time.perf_counter() - t0
            one_job(cache, decoder, latents, root / "out", f"prime-{size}", None,
                    args.segment_frames)  # first job of the process: lazy inits, untimed
            for first in firsts:
                jobs = [one_job(cache, decoder, latents, root / "out", f"j-{size}-{first}-{r}",
                                first, args.segment_frames) for r in range(args.reps)]
                ttfp = [j["ttfp_s"] for j in jobs]
                run = {"size": size, "first_segment_frames": first, "warmup_s": warmup_s,
                       "ttfp_s_median": statistics.median(ttfp), "ttfp_s": ttfp,
                       "wall_s_median": statistics.median(j["wall_s"] for j in jobs),
                       "jobs": jobs}
                report["runs"].append(run)
                rows.append((size, first or args.segment_frames, jobs[0]["first_segment_frames"],
                             run["ttfp_s_median"], min(ttfp), max(ttfp), run["wall_s_median"]))
                if args.out:  # after every configuration: a cut-off run still leaves data
                    write_json(args.out, report)
    print("| size | first segment (frames) | ttfp median ms | min | max | job wall median s |")
    print("|---|---|---|---|---|---|")
    for size, first, got, med, lo, hi, wall in rows:
        assert got == min(first, args.frames)
        print(f"| {size} | {first} | {med * 1e3:.1f} | {lo * 1e3:.1f} | {hi * 1e3:.1f} "
              f"| {wall:.3f} |")


if __name__ == "__main__":
    main()
