"""The modes ``pipeline.py`` times, one job each: the decoder's stream alone, the framefleet
pipeline (async, sequential), diffusers' decode + export; and the timing around one run (wall,
peak GPU memory, host RSS sampled every 5 ms) and the medians over repetitions."""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import psutil
import torch

from producer.settings import Settings
from producer.wire.spec import PipelineSpec, VideoSpec
from worker.decoders.wan import WanDecoder
from worker.pipeline import ClosedSegment, run_pipeline
from worker.stores.storage import JobOutput

Mode = Callable[[WanDecoder, torch.Tensor, Path], dict[str, Any]]
SEGMENT_FRAMES = 48


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
    return {"gpu_busy_ratio": busy / window,
            "first_chunk_ms": events[0][0].elapsed_time(events[0][1]),
            "chunk_ms_median": statistics.median(s.elapsed_time(e) for s, e in events[1:])
            if len(events) > 1 else None}


def pipeline_mode(mode: Literal["async", "sequential"],
                  tune: Literal["zerolatency", "none"] = "zerolatency",
                  tail_parts: int = 1) -> Mode:
    def run(decoder: WanDecoder, z: torch.Tensor, out_dir: Path) -> dict[str, Any]:
        out = JobOutput((out_dir / "videos").as_uri(), Settings(file_roots=str(out_dir)))
        segments: list[ClosedSegment] = []

        def sink(seg: ClosedSegment) -> None:
            out.put_file(f"segment-{seg.index:05d}.mp4", seg.file.path)
            segments.append(seg)

        with tempfile.TemporaryDirectory(dir=out_dir) as scratch:
            report = run_pipeline(decoder, z,
                                  video=VideoSpec(segment_frames=SEGMENT_FRAMES, tune=tune),
                                  pipeline=PipelineSpec(mode=mode), scratch=Path(scratch),
                                  sink=sink, tail_parts=tail_parts)
        sync(decoder.device)
        s = report.stats
        assert sum(seg.file.frames for seg in segments) == report.frames
        return {"gpu_busy_ratio": s.gpu_busy_ratio, "frames": report.frames,
                "segments": len(segments), "bytes": sum(seg.file.bytes for seg in segments),
                "tail_s": s.tail_s, "stage_s": {
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


MODES: dict[str, Mode] = {
    "decode_only": decode_only,
    "async": pipeline_mode("async"),
    "async_tail2": pipeline_mode("async", tail_parts=2),
    "async_tail4": pipeline_mode("async", tail_parts=4),
    "async_x264_default_tune": pipeline_mode("async", tune="none"),
    "sequential": pipeline_mode("sequential"),
    "diffusers": diffusers_mode,
}


def run_once(mode: str, decoder: WanDecoder, z: torch.Tensor, work: Path) -> dict[str, Any]:
    """One timed job. No empty_cache(): a worker runs job after job on a warm allocator."""
    device = decoder.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    with tempfile.TemporaryDirectory(dir=work) as tmp, RssPeak() as rss:
        t0 = time.perf_counter()
        extra = MODES[mode](decoder, z, Path(tmp))
        sync(device)
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "peak_rss_bytes": rss.peak,
            "peak_gpu_bytes": torch.cuda.max_memory_allocated(device)
            if device.type == "cuda" else None, **extra}


def summarise(mode: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions; lists where they vary (walls, tails)."""
    walls = [r["wall_s"] for r in runs]
    out: dict[str, Any] = {"mode": mode, "reps": len(runs), "wall_s": statistics.median(walls),
                           "walls_s": walls}
    for key in ("tail_s", "bytes", "gpu_busy_ratio", "first_chunk_ms", "chunk_ms_median"):
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    if runs[0].get("tail_s") is not None:
        out["tails_s"] = [r["tail_s"] for r in runs]
    if "stage_s" in runs[0]:
        out["stage_s"] = {k: statistics.median(r["stage_s"][k] for r in runs)
                          for k in runs[0]["stage_s"]}
    for key in ("segments", "frames", "writer"):
        if key in runs[-1]:
            out[key] = runs[-1][key]
    out["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in runs)
    gpu = [r["peak_gpu_bytes"] for r in runs if r["peak_gpu_bytes"] is not None]
    out["peak_gpu_bytes"] = max(gpu) if gpu else None
    return out
