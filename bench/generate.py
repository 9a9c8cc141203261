"""Generate-job benchmark: framefleet's whole job vs diffusers' WanPipeline + export_to_video.

Per model (random weights at the real architecture, built directly on the device: UMT5-XXL
text encoder, the Wan transformer and VAE, Wan's UniPC scheduler) and per step count:

  framefleet   run_job of a generate spec: prompt encode, denoise (diffusers' WanPipeline,
               output_type="latent"), latents handed on the GPU to the streamed decoder, the
               async pipeline (GPU post-process, D2H ring, x264 segments, upload to file://);
               it also writes latents.safetensors (a D2H copy the baseline does not pay)
  diffusers    WanPipeline(same components, same scheduler config)(..., output_type="np") and
               diffusers.utils.export_to_video (PyAV libx264 when its imageio-ffmpeg or OpenCV
               backend is missing; the JSON says which ran)

Correctness first: both must give identical latents for the same seed (the baseline's are
captured at its last step, framefleet's from latents.safetensors); a mismatch exits non-zero.
Reported per run: wall time per stage, the GPU's busy share over the whole job ((text encode +
denoise + GPU decode time) / wall: the first two are GPU-bound and synchronised, so an upper
bound) and the decode's share, the speed-up, peak GPU memory. Once per model: what moving the
text encoder to the host and back costs (FRAMEFLEET_TEXT_ENCODER_OFFLOAD).

  python bench/generate.py --models wan2.1-t2v-1.3b,wan2.2-ti2v-5b --steps 4,20 --out DIR
  python bench/generate.py --tiny --out DIR       # CPU, a few seconds (CI runs it)
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from producer.settings import Settings
from producer.spec import GenerateSpec, JobSpec, OutputSpec, VideoSpec
from worker.generate.cache import ModelCache, module_bytes
from worker.generate.denoise import generator, job_pipeline
from worker.generate.folder import read_model
from worker.generate.handoff import vae_latents
from worker.generate.presets import PRESETS, build_pipeline, save_configs
from worker.generate.text import MAX_SEQUENCE_LENGTH
from worker.run import DecoderCache, Run, run_job

PROMPT = "a red fox runs through deep snow at dawn, cinematic, detailed fur"
NEGATIVE = "blurry, low quality, static"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def export_baseline(frames: Any, path: Path, fps: float) -> str:
    """diffusers' export_to_video; PyAV libx264 (its imageio backend's codec) when the
    backends it needs are missing. Returns which one wrote the file."""
    try:
        from diffusers.utils import export_to_video

        export_to_video(list(frames), str(path), fps=int(fps))
        return "diffusers.export_to_video"
    except (ImportError, AttributeError, RuntimeError, OSError) as e:
        import av
        import numpy as np

        with av.open(str(path), mode="w") as out:
            stream = out.add_stream("libx264", rate=int(fps))
            stream.height, stream.width = frames.shape[1], frames.shape[2]
            stream.pix_fmt = "yuv420p"
            for frame in frames:
                rgb = (frame * 255).astype(np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        return f"pyav libx264 (export_to_video unavailable: {type(e).__name__})"


@torch.no_grad()
def baseline(pipe: Any, gen: GenerateSpec, info: Any, device: torch.device, path: Path
             ) -> dict[str, Any]:
    """diffusers alone, as a user would run it, with one capture of the final latents."""
    run = job_pipeline(pipe, gen, info)  # WanPipeline(...) over the same components
    captured: dict[str, Any] = {}

    def last(p: Any, i: int, t: Any, kw: dict[str, Any]) -> dict[str, Any]:
        if i == p.num_timesteps - 1:
            captured["latents"] = kw["latents"].clone()
            sync(device)
            captured["loop_end"] = time.perf_counter()
        return {}

    sync(device)
    t0 = time.perf_counter()
    video = run(
        prompt=gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
        width=gen.width, num_frames=gen.num_frames, num_inference_steps=gen.num_inference_steps,
        guidance_scale=gen.guidance_scale, generator=generator(gen), output_type="np",
        max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False,
        callback_on_step_end=last, callback_on_step_end_tensor_inputs=["latents"],
    )[0][0]
    t1 = time.perf_counter()
    how = export_baseline(video, path, 16.0)
    t2 = time.perf_counter()
    return {
        "wall_s": t2 - t0, "encode_and_denoise_s": captured["loop_end"] - t0,
        "decode_postprocess_s": t1 - captured["loop_end"], "export_s": t2 - t1,
        "export": how, "latents": vae_latents(pipe.vae, captured["latents"]),
    }


def framefleet(spec: JobSpec, decoders: DecoderCache, settings: Settings) -> dict[str, Any]:
    from safetensors.torch import load_file

    from producer.cost import cost_for_job

    result = run_job(spec, decoders, Run(spec, cost=cost_for_job, settings=settings))
    t = result.timings
    busy = t.text_encode_s + t.denoise_s + t.decode_s
    assert result.manifest.latents_uri is not None
    latents = load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]
    return {
        "wall_s": t.wall_s, "load_s": t.load_s, "text_encode_s": t.text_encode_s,
        "denoise_s": t.denoise_s, "decode_gpu_s": t.decode_s,
        "decode_stage_s": t.wall_s - t.load_s - t.text_encode_s - t.denoise_s,
        "encode_s": t.encode_s, "upload_s": t.upload_s,
        "gpu_busy_share": busy / t.wall_s, "decode_share": t.decode_s / t.wall_s,
        "decode_gpu_busy_ratio": t.gpu_busy_ratio, "frames": result.manifest.frames,
        "segments": len(result.manifest.segments),
        "cost_stages": [s.model_dump() for s in result.cost.stages] if result.cost else [],
        "latents": latents,
    }


def offload_probe(pipe: Any, device: torch.device) -> dict[str, Any]:
    """Seconds to move the text encoder to the host and back (pageable host memory)."""
    enc = pipe.text_encoder
    size = module_bytes(enc)
    sync(device)
    t0 = time.perf_counter()
    enc.to("cpu")
    t1 = time.perf_counter()
    enc.to(device)
    sync(device)
    t2 = time.perf_counter()
    return {"text_encoder_gib": size / 2**30, "to_host_s": t1 - t0, "to_device_s": t2 - t1}


def bench_model(args: argparse.Namespace, name: str, device: torch.device, dtype: torch.dtype,
                work: Path, save: Any) -> list[dict[str, Any]]:
    """Every run of one model; ``save(row)`` after each, so a cut-off run keeps what it did."""
    height, width, frames = PRESETS[name].default_size
    if args.size:
        height, width, frames = (int(v) for v in args.size.split("x"))
    t0 = time.perf_counter()
    pipe = build_pipeline(name, device, dtype, seed=0)
    sync(device)
    build_s = time.perf_counter() - t0
    folder = save_configs(pipe, work / name)
    info = read_model(folder)
    settings = Settings(device="cuda" if device.type == "cuda" else "cpu",
                        max_denoise_steps=10_000, max_pixels=4096 * 4096,
                        decode_graphs=args.decode_graphs, work_dir=str(work),
                        file_roots=str(work))
    models = ModelCache(device, 2**40, graphs=args.decode_graphs)
    entry = models.adopt(folder, pipe)
    decoders = DecoderCache(device, graphs=args.decode_graphs, models=models)
    meta = {"model": name, "size": f"{width}x{height}x{frames}", "build_s": build_s,
            "resident_gib": entry.bytes / 2**30}
    print(json.dumps(meta), flush=True)
    if args.decode_graphs and device.type == "cuda":
        # as a worker's warm-up does: compile and capture before the first timed job
        models.decoder(entry).warmup(height // info.spatial_factor, width // info.spatial_factor)
    rows = []
    plan = [args.warmup_steps, *args.steps] if args.warmup_steps else args.steps
    for i, steps in enumerate(plan):
        warm = bool(args.warmup_steps) and i == 0
        gen = GenerateSpec(model=folder.as_uri(), prompt=PROMPT, negative_prompt=NEGATIVE,
                           height=height, width=width, num_frames=frames,
                           num_inference_steps=steps, guidance_scale=5.0, seed=42,
                           dtype="auto", save_latents=True)
        spec = JobSpec(job_id=f"bench-{name}-{steps}-{i}", generate=gen,
                       output=OutputSpec(uri=(work / "out").as_uri()), video=VideoSpec())
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ff = framefleet(spec, decoders, settings)
        peak_ff = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        base = baseline(pipe, gen, info, device, work / f"base-{name}-{steps}-{i}.mp4")
        peak_b = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0
        identical = bool(torch.equal(ff.pop("latents"), base.pop("latents").float().cpu()))
        row = {**meta, "steps": steps, "warmup": warm, "latents_identical": identical,
               "framefleet": ff, "diffusers": base, "speedup": base["wall_s"] / ff["wall_s"],
               "peak_gib": {"framefleet": peak_ff, "diffusers": peak_b}}
        print(json.dumps({k: row[k] for k in ("model", "steps", "warmup", "latents_identical",
                                              "speedup")}), flush=True)
        if not warm:
            rows.append(row)
            save(row)
        if not identical:
            print(f"FAIL: {name} {steps} steps: latents differ from diffusers'", flush=True)
    if args.offload_probe and device.type == "cuda":
        probe = offload_probe(pipe, device)
        print(json.dumps(probe), flush=True)
        for row in rows:
            row["text_encoder_offload"] = probe
        save(None)
    del pipe, entry, models, decoders
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| model | size | steps | ff wall s | text s | denoise s | decode stage s | "
            "GPU busy | decode share | diffusers wall s | diffusers decode+export s | "
            "speed-up | latents equal |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        f, b = r["framefleet"], r["diffusers"]
        lines.append(
            f"| {r['model']} | {r['size']} | {r['steps']} | {f['wall_s']:.2f} | "
            f"{f['text_encode_s']:.2f} | {f['denoise_s']:.2f} | {f['decode_stage_s']:.2f} | "
            f"{f['gpu_busy_share']:.0%} | {f['decode_share']:.0%} | {b['wall_s']:.2f} | "
            f"{b['decode_postprocess_s'] + b['export_s']:.2f} | {r['speedup']:.2f}x | "
            f"{'yes' if r['latents_identical'] else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="wan2.1-t2v-1.3b,wan2.2-ti2v-5b")
    ap.add_argument("--steps", default="4,20", type=lambda s: [int(v) for v in s.split(",")])
    ap.add_argument("--size", default=None, help="HxWxF for every model (default: its own)")
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="an untimed run of each side first, at this many steps (0: none)")
    ap.add_argument("--decode-graphs", type=int, default=0,
                    help="framefleet's compiled decode graphs (FRAMEFLEET_DECODE_GRAPHS)")
    ap.add_argument("--no-offload-probe", dest="offload_probe", action="store_false")
    ap.add_argument("--tiny", action="store_true",
                    help="CPU-sized: the tiny and tiny-ti2v presets, 2 steps (CI)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", required=True, help="folder for generate.json")
    args = ap.parse_args()
    if args.tiny:
        # the 1.3B and the TI2V-5B layouts in miniature, each at its own size
        args.models, args.steps = "tiny,tiny-ti2v", [2]
        args.warmup_steps, args.offload_probe = 0, False
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else
        platform.processor() or "cpu",
        "torch": torch.__version__, "dtype": str(dtype), "runs": [],
    }
    try:
        import diffusers
        import transformers

        doc["diffusers"], doc["transformers"] = diffusers.__version__, transformers.__version__
    except ImportError:
        pass
    failed = False

    def save(row: dict[str, Any] | None) -> None:
        if row is not None:
            doc["runs"].append(row)
        (out / "generate.json").write_text(json.dumps(doc, indent=2))

    with tempfile.TemporaryDirectory(prefix="ff-gen-bench-") as tmp:
        for name in args.models.split(","):
            rows = bench_model(args, name, device, dtype, Path(tmp), save)
            failed |= not all(r["latents_identical"] for r in rows)
    print(table(doc["runs"]))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
