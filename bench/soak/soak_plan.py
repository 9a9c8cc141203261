"""The soak's traffic (``soak.py``): which jobs, in which order, and what each must end in.

One round is a mix a GPU fleet sees: prompt jobs on the two model sizes at three sizes each
and every tier (exact, fp8, the recommended step cache, fp8 + cache), image-to-video, two LoRAs
switching, decode-only jobs at sizes the worker has not seen, sent right behind a long denoise
(their graphs build in the background while the next job denoises), a job cancelled during its
denoise, a job over the memory limit, a hostile model folder. Rounds repeat until the soak has
run its minutes and jobs; every prompt job of a round is repeated in a later round with the
same seed, so outputs can be compared across the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.generate.gen_specs import bench_id
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec

PROMPT = "a red fox runs through deep snow at dawn, cinematic, detailed fur"
#: The step cache of the cache tiers (bench/generate/gen_specs.py's RECOMMENDED_CACHE).
CACHE: dict[str, Any] = {"kind": "taylorseer", "cache_interval": 4,
                         "disable_cache_before_step": 2, "max_order": 1}


@dataclass
class Item:
    """One job of the soak and what it must end in."""

    spec: JobSpec
    kind: str  # t2v, i2v, lora, decode, cancel, memory, hostile
    expect: str = "success"  # success | cancelled | failure:<error class>
    #: Jobs with the same group must give identical segments (same seed, tier, inputs).
    group: str | None = None
    frames: int = 0
    #: Submit it only once the job before it is denoising (decode sizes behind a denoise).
    behind_denoise: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Setup:
    """What the plan refers to: model folders, files, sizes and the tiers this device runs."""

    big: Path  # the 5B's folder (TI2V layout)
    small: Path  # the 1.3B's folder
    out: str  # output URI prefix
    image: Path
    loras: list[Path]
    hostile: Path
    hog: Path  # latents larger than the worker's memory limit
    decode_inputs: list[tuple[str, Path, int]]  # (decoder, latents file, frames)
    big_sizes: list[tuple[int, int, int]]
    small_sizes: list[tuple[int, int, int]]
    steps: int
    long_steps: int
    cancel_steps: int  # the cancelled job's: it must still denoise when the cancel comes
    tiers: list[str]  # of exact, fp8, cache, fp8+cache
    #: Tiers this device lacks (fp8 on the CPU): their jobs are planned to be refused.
    refused: list[str] = field(default_factory=list)


def _gen(s: Setup, model: Path, size: tuple[int, int, int], tier: str, steps: int,
         seed: int = 42, **extra: Any) -> dict[str, Any]:
    h, w, f = size
    return {"model": model.as_uri(), "prompt": PROMPT, "height": h, "width": w,
            "num_frames": f, "num_inference_steps": steps, "guidance_scale": 5.0, "seed": seed,
            "save_latents": True, "tier": "fp8" if tier.startswith("fp8") else "exact",
            "cache": CACHE if tier.endswith("cache") else None, **extra}


def _job(s: Setup, job_id: str, gen: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate({"job_id": bench_id(job_id), "tenant": "soak", "generate": gen,
                                   "output": {"uri": s.out}, "video": {"segment_frames": 24}})


def round_items(s: Setup, r: int) -> list[Item]:
    """Round ``r``'s jobs, in submission order."""
    items: list[Item] = []

    def t2v(model: Path, name: str, size: tuple[int, int, int], tier: str, **kw: Any) -> Item:
        gen = _gen(s, model, size, tier, s.steps, **kw)
        group = f"{name}-{size[0]}x{size[1]}x{size[2]}-{tier}-{kw.get('seed', 42)}"
        expect = "failure:InvalidJobError" if tier in s.refused else "success"
        return Item(_job(s, f"r{r}-{group}", gen), "t2v", expect, group=group, frames=size[2],
                    meta={"model": name, "tier": tier, "size": f"{size[1]}x{size[0]}x{size[2]}"})

    for i, size in enumerate(s.big_sizes):
        items.append(t2v(s.big, "5b", size, s.tiers[(i + r) % len(s.tiers)]))
    for i, size in enumerate(s.small_sizes):
        items.append(t2v(s.small, "1.3b", size, ("exact", "cache")[(i + r) % 2]))
    # image-to-video on the 5B (its first frame), and two LoRAs switching
    size = s.big_sizes[0]
    i2v = _gen(s, s.big, size, "exact", s.steps, image=s.image.as_uri())
    items.append(Item(_job(s, f"r{r}-i2v", i2v), "i2v", group="i2v", frames=size[2]))
    for n, lora in enumerate(s.loras):
        gen = _gen(s, s.big, size, "exact", s.steps, loras=[{"uri": lora.as_uri(),
                                                             "scale": 0.8}])
        items.append(Item(_job(s, f"r{r}-lora{n}", gen), "lora", group=f"lora{n}",
                          frames=size[2]))
    # a long denoise, with decode-only jobs at new sizes right behind it
    long = _gen(s, s.big, s.big_sizes[-1], "exact", s.long_steps, seed=7 + r)
    items.append(Item(_job(s, f"r{r}-long", long), "t2v", frames=s.big_sizes[-1][2]))
    for n, (decoder, path, frames) in enumerate(s.decode_inputs):
        spec = JobSpec(job_id=f"r{r}-decode{n}", tenant="soak", input=InputSpec(uri=path.as_uri()),
                       decoder=DecoderSpec(name=decoder, weights="random"),  # type: ignore[arg-type]
                       output=OutputSpec(uri=s.out), video=VideoSpec(segment_frames=24))
        items.append(Item(spec, "decode", group=f"decode{n}", frames=frames,
                          behind_denoise=n == 0))
    items.append(t2v(s.big, "5b", s.big_sizes[1], "exact", seed=1000 + r))  # after the decodes
    # a cancel during a denoise; a hostile folder; once, a job over the memory limit
    cancel = _gen(s, s.big, s.big_sizes[0], "exact", s.cancel_steps, seed=99)
    items.append(Item(_job(s, f"r{r}-cancel", cancel), "cancel", expect="cancelled"))
    hostile = _gen(s, s.hostile, s.big_sizes[0], "exact", s.steps)
    items.append(Item(_job(s, f"r{r}-hostile", hostile), "hostile",
                      expect="failure:InvalidJobError|PathRefusedError"))
    if r == 1:
        spec = JobSpec(job_id="r1-memory", tenant="soak", input=InputSpec(uri=s.hog.as_uri()),
                       decoder=DecoderSpec(name="pattern"), output=OutputSpec(uri=s.out))
        items.append(Item(spec, "memory", expect="failure:FatalJobError"))
    return items
