"""Pipeline benchmark: how close does a whole job get to the pure decode time?

Modes, on the same decoder and latents (Wan2.1 VAE architecture, seeded random weights):
  decode_only  streamed decode, nothing else (the floor)
  async        the framefleet pipeline: streams, events, pinned ring, encoder threads, upload
  sequential   decode → synchronous fp32 .cpu() → CPU post-process → encode → upload, per chunk
  diffusers    vae.decode(z) on the whole clip, then diffusers' export_to_video
Per mode: wall (median of --reps), ratio to decode_only, GPU busy fraction inside the decode
window (CUDA events), peak GPU memory, peak host RSS. Writes JSON; prints a markdown table.

  python bench/pipeline.py --device cuda --sizes 1280x720,832x480 --frames 81 --reps 3 \
      --scale4 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producer.settings import Settings
from producer.spec import PipelineSpec, VideoSpec
from worker.decoders.wan import WanDecoder, build_vae
from worker.pipeline import ClosedSegment, run_pipeline
from worker.sinks.storage import JobOutput


class RssPeak:
    """Samples this process's RSS every 5 ms while active (ru_maxrss cannot be reset)."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> RssPeak:
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_only(decoder: WanDecoder, z: torch.Tensor, out_dir: Path) -> dict[str, Any]:
    device = decoder.device
    cuda = device.type == "cuda"
    events = []
    it = decoder.stream(z)
    while True:
        start = torch.cuda.Event(enable_timing=True) if cuda else None
        if start is not None:
            start.record()
        chunk = next(it, None)
        if chunk is None:
            break
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            events.append((start, end))
        del chunk
    sync(device)
    if not events:
        return {}
    busy = sum(s.elapsed_time(e) for s, e in events)
    window = events[0][0].elapsed_time(events[-1][1])
    return {"gpu_busy_ratio": busy / window, "chunk_ms_median":
            statistics.median(s.elapsed_time(e) for s, e in events)}


def pipeline_mode(
    mode: str, tune: str = "zerolatency"
) -> Callable[[WanDecoder, torch.Tensor, Path], dict[str, Any]]:
    def run(decoder: WanDecoder, z: torch.Tensor, out_dir: Path) -> dict[str, Any]:
        out = JobOutput((out_dir / "videos").as_uri(), Settings(file_roots=str(out_dir)))
        segments: list[ClosedSegment] = []

        def sink(seg: ClosedSegment) -> None:
            out.put_file(f"segment-{seg.index:05d}.mp4", seg.file.path)
            segments.append(seg)

        with tempfile.TemporaryDirectory(dir=out_dir) as scratch:
            report = run_pipeline(decoder, z, video=VideoSpec(segment_frames=48, tune=tune),
                                  pipeline=PipelineSpec(mode=mode), scratch=Path(scratch),
                                  sink=sink)
        sync(decoder.device)
        s = report.stats
        assert sum(seg.file.frames for seg in segments) == report.frames
        return {"gpu_busy_ratio": s.gpu_busy_ratio, "frames": report.frames,
                "segments": len(segments), "stage_s": {
                    "decode": s.decode_s, "postprocess": s.postprocess_s, "d2h": s.d2h_s,
                    "encode": s.encode_s, "upload": s.upload_s,
                    "backpressure": s.backpressure_s}}
    return run


def diffusers_mode(decoder: WanDecoder, z: torch.Tensor, out_dir: Path) -> dict[str, Any]:
    from diffusers.utils import export_utils

    with torch.inference_mode():
        video = decoder.vae.decode(z.to(decoder.device, decoder.dtype)[None]).sample
        # What diffusers' video pipelines do next (VideoProcessor.postprocess_video, "np").
        frames = (video[0].float() / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu().numpy()
    path = str(out_dir / "diffusers.mp4")
    try:
        import imageio

        imageio.plugins.ffmpeg.get_exe()
        export_utils.export_to_video(list(frames), path, fps=16)
        writer = "export_to_video (imageio-ffmpeg, libx264)"
    except Exception:  # noqa: BLE001 - no ffmpeg executable: diffusers' own OpenCV fallback
        export_utils._legacy_export_to_video(list(frames), path, fps=16)
        writer = "export_to_video legacy OpenCV backend (mp4v): no imageio-ffmpeg here"
    return {"writer": writer, "frames": int(frames.shape[0])}


MODES: dict[str, Callable[[WanDecoder, torch.Tensor, Path], dict[str, Any]]] = {
    "decode_only": decode_only,
    "async": pipeline_mode("async"),
    "async_x264_default_tune": pipeline_mode("async", tune="none"),
    "sequential": pipeline_mode("sequential"),
    "diffusers": diffusers_mode,
}


def measure(mode: str, decoder: WanDecoder, z: torch.Tensor, reps: int,
            work: Path) -> dict[str, Any]:
    device = decoder.device
    walls, extra, peaks_gpu, peaks_rss, rss_start = [], {}, [], [], 0
    for _ in range(reps):
        if device.type == "cuda":
            # No empty_cache(): a worker runs job after job on a warm allocator.
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        with tempfile.TemporaryDirectory(dir=work) as tmp, RssPeak() as rss:
            t0 = time.perf_counter()
            extra = MODES[mode](decoder, z, Path(tmp))
            sync(device)
            walls.append(time.perf_counter() - t0)
        peaks_rss.append(rss.peak)
        rss_start = rss.start
        if device.type == "cuda":
            peaks_gpu.append(torch.cuda.max_memory_allocated(device))
    return {"wall_s": statistics.median(walls), "walls_s": walls,
            "peak_gpu_bytes": max(peaks_gpu) if peaks_gpu else None,
            "peak_rss_bytes": max(peaks_rss), "rss_at_start_bytes": rss_start, **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--preset", default="wan2.1")
    ap.add_argument("--sizes", default="1280x720,832x480")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes",
                    default="decode_only,async,async_x264_default_tune,sequential,diffusers")
    ap.add_argument("--scale4", action="store_true",
                    help="memory flatness: 1x and 4x frames, each in a fresh process")
    ap.add_argument("--flatness-modes", default="decode_only,async;diffusers")
    ap.add_argument("--graphs", type=int, default=2,
                    help="compiled decode graphs (the worker's default); 0: eager decode")
    ap.add_argument("--out", default="bench/results/pipeline.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
             "float32": torch.float32}[args.dtype]
    decoder = WanDecoder(build_vae(args.preset, seed=0, dtype=dtype), device, graphs=args.graphs)
    work = Path(tempfile.mkdtemp(prefix="ffbench-"))
    results: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else
        platform.processor() or "cpu", "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "dtype": args.dtype, "preset": args.preset, "store": "file:// (local disk)", "runs": [],
        "graphs": args.graphs, "warmup_s": {},
    }
    plan = [(size, args.frames, args.modes.split(",")) for size in args.sizes.split(",")]
    for size, frames, modes in plan:
        w, h = (int(v) for v in size.split("x"))
        t = (frames - 1) // 4 + 1
        z = torch.randn(16, t, h // 8, w // 8, generator=torch.Generator().manual_seed(0))
        t0 = time.perf_counter()
        decoder.warmup(h // 8, w // 8)  # on CUDA with --graphs: compile + capture
        results["warmup_s"][size] = time.perf_counter() - t0
        for mode in modes:
            reps = args.reps if frames == args.frames else 1
            r = measure(mode, decoder, z, reps, work)
            r.update(size=size, frames=frames, mode=mode, reps=reps)
            results["runs"].append(r)
            print(f"{size} {frames:4d} {mode:12s} wall {r['wall_s']:.3f} s", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2))
    if args.scale4:
        results["flatness"] = flatness(args, args.sizes.split(",")[0])
        Path(args.out).write_text(json.dumps(results, indent=2))
    print(table(results))


def flatness(args: argparse.Namespace, size: str) -> list[dict[str, Any]]:
    """Peak RSS and GPU memory of a whole job at 1x and 4x frames, each in a fresh process
    (one process's RSS carries the heap left by earlier modes, which would blur the ratio)."""
    runs = []
    for modes in args.flatness_modes.split(";"):
        for frames in (args.frames, 4 * (args.frames - 1) + 1):
            with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                cmd = [sys.executable, __file__, "--device", args.device, "--dtype", args.dtype,
                       "--preset", args.preset, "--sizes", size, "--frames", str(frames),
                       "--graphs", str(args.graphs),
                       "--reps", "1", "--modes", modes, "--out", tmp.name]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                runs += [{**r, "fresh_process": True}
                         for r in json.loads(Path(tmp.name).read_text())["runs"]]
            print(f"flatness {size} {frames} {modes} done", flush=True)
    return runs


def table(results: dict[str, Any]) -> str:
    runs = results["runs"] + results.get("flatness", [])
    floor: dict[tuple[str, int], float] = {}
    lines = ["| size | frames | mode | wall s | × decode-only | GPU busy | peak GPU MiB | "
             "peak RSS MiB |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if r["mode"] == "decode_only":
            floor[(r["size"], r["frames"])] = r["wall_s"]
        base = floor.get((r["size"], r["frames"]))
        ratio = f"{r['wall_s'] / base:.3f}" if base else "-"
        busy = f"{r['gpu_busy_ratio'] * 100:.2f} %" if r.get("gpu_busy_ratio") else "-"
        gpu = f"{r['peak_gpu_bytes'] / 2**20:.0f}" if r.get("peak_gpu_bytes") else "-"
        mode = r["mode"] + (" (fresh process)" if r.get("fresh_process") else "")
        lines.append(f"| {r['size']} | {r['frames']} | {mode} | {r['wall_s']:.3f} | "
                     f"{ratio} | {busy} | {gpu} | {r['peak_rss_bytes'] / 2**20:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
