"""The extra rows of ``bench/generate/generate.py``: an image-to-video job and a LoRA switch.

- ``image``: one image-to-video job on a TI2V model at its size, against diffusers'
  ``WanImageToVideoPipeline`` + export in the same run. framefleet's denoise runs eager here
  (as a worker with ``FRAMEFLEET_COMPILED_SIZES=0``), so its latents must equal diffusers' bit
  for bit; its speed-up is the rest of the job (hand-off, decode, encode). When the budget
  allows, the same job at the exact tier compiled follows, with its rel L2.
- ``lora``: what switching LoRAs costs on the model: load (read, check, ``load_lora_weights``),
  ``set_adapters``, the first step with the adapter, and a plain step while adapters are
  loaded (the transformer runs eager then). Two random rank-32 LoRAs on every attention
  projection.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.generate.gen_runs import baseline, framefleet, rel_l2, sync
from bench.generate.gen_specs import gen_spec, job

LORA_RANK = 32
LORA_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                "attn2.to_k", "attn2.to_v", "attn2.to_out.0")


def extras(args: argparse.Namespace, m: Any, doc: dict[str, Any], budget: Any,
           save: Any) -> None:
    """The image-to-video and LoRA rows asked for on this model."""
    if args.image == m.name:
        image_rows(args, m, doc, budget, save)
    if args.lora == m.name:
        lora_rows(m, doc, budget, save)


def _image(m: Any) -> Path:
    from PIL import Image

    h, w, _ = m.size
    path = m.work / f"first-{m.name}.png"
    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(path)
    return path


def image_rows(args: argparse.Namespace, m: Any, doc: dict[str, Any], budget: Any,
               save: Any) -> None:
    from worker.inputs.image import load_image

    steps = args.image_steps
    if m.info.image_input == "none":
        doc["skipped"].append({"what": f"{m.name} image", "reason": "a text-to-video model"})
        return
    if not budget.fits(f"{m.name} image-to-video {steps} steps", 60 + 5 * steps):
        return
    uri = _image(m).as_uri()
    h, w, _ = m.size
    sized = load_image(uri, "generate.image", w, h, "crop", m.settings).image
    base = baseline(m.pipe, gen_spec(m.folder, m.size, steps, "exact", image=uri), m.info,
                    m.device, m.work / f"base-{m.name}-i2v.mp4", image=sized)
    limit = m.models.compiled_sizes
    m.models.compiled_sizes = 0  # eager denoise: diffusers' kernels, its latents exactly
    try:
        ff = framefleet(job(m.work, m.name, gen_spec(m.folder, m.size, steps, "exact",
                                                     image=uri), "i2v-eager"),
                        m.decoders, m.settings)
    finally:
        m.models.compiled_sizes = limit
    latents = ff.pop("latents")
    ff.pop("segment_files")
    row = {**m.meta, "kind": "image-to-video", "steps": steps, "denoise": "eager",
           "latents_identical_to_diffusers": bool(torch.equal(latents, base["latents"])),
           "framefleet_wall_s": ff["wall_s"], "diffusers_wall_s": base["wall_s"],
           "speedup": base["wall_s"] / ff["wall_s"], "framefleet": ff,
           "diffusers": {k: v for k, v in base.items() if k != "latents"}}
    doc["failed"] |= not row["latents_identical_to_diffusers"]
    save(row, "extras")
    if budget.fits(f"{m.name} image-to-video {steps} steps compiled", 40 + 3 * steps):
        gen = gen_spec(m.folder, m.size, 1, "exact", image=uri)
        framefleet(job(m.work, m.name, gen, "i2v-warm"), m.decoders, m.settings)  # compiles
        fc = framefleet(job(m.work, m.name, gen_spec(m.folder, m.size, steps, "exact",
                                                     image=uri), "i2v-compiled"),
                        m.decoders, m.settings)
        z = fc.pop("latents")
        fc.pop("segment_files")
        save({**m.meta, "kind": "image-to-video", "steps": steps, "denoise": "compiled",
              "framefleet_wall_s": fc["wall_s"], "diffusers_wall_s": base["wall_s"],
              "speedup": base["wall_s"] / fc["wall_s"],
              "latents_rel_l2_vs_diffusers": rel_l2(z, base["latents"]), "framefleet": fc},
             "extras")


def make_lora(m: Any, path: Path, seed: int) -> Path:
    """A random rank-32 LoRA on every attention projection of the model's transformer."""
    from safetensors.torch import save_file

    g = torch.Generator("cpu").manual_seed(seed)
    state = {}
    transformer = m.pipe.transformer
    for i in range(len(transformer.blocks)):
        for target in LORA_TARGETS:
            layer = transformer.get_submodule(f"blocks.{i}.{target}")
            layer = getattr(layer, "base_layer", layer)
            key = f"transformer.blocks.{i}.{target}"
            state[f"{key}.lora_A.weight"] = (torch.randn(LORA_RANK, layer.in_features,
                                                         generator=g) * 0.01).to(torch.bfloat16)
            state[f"{key}.lora_B.weight"] = (torch.randn(layer.out_features, LORA_RANK,
                                                         generator=g) * 0.01).to(torch.bfloat16)
    save_file(state, path)
    return path


def lora_rows(m: Any, doc: dict[str, Any], budget: Any, save: Any) -> None:

    if not budget.fits(f"{m.name} LoRA switch", 60):
        return
    files = [make_lora(m, m.work / f"lora-{i}.safetensors", i) for i in range(2)]
    size = files[0].stat().st_size

    def one(tag: str, loras: list[dict[str, Any]]) -> dict[str, Any]:
        gen = gen_spec(m.folder, m.size, 1, "exact", loras=loras)
        ff = framefleet(job(m.work, m.name, gen, tag), m.decoders, m.settings)
        ff.pop("latents")
        ff.pop("segment_files")
        return {"adapter_load_s": ff["adapter_load_s"], "first_step_s": ff["denoise_s"],
                "wall_s": ff["wall_s"]}

    runs = {
        "first_lora": one("lora-a", [{"uri": files[0].as_uri(), "scale": 1.0}]),
        "switch_to_second": one("lora-b", [{"uri": files[1].as_uri(), "scale": 0.8}]),
        "back_to_first_resident": one("lora-a2", [{"uri": files[0].as_uri(), "scale": 0.5}]),
        "plain_with_adapters_loaded": one("lora-none", []),
    }
    entry = m.exact
    name = next(iter(entry.adapters.loaded))
    times = []
    for scale in (0.3, 0.6, 0.9):
        sync(m.device)
        t0 = time.perf_counter()
        entry.pipe.transformer.set_adapters([name], weights=[scale])
        sync(m.device)
        times.append(time.perf_counter() - t0)
    entry.pipe.transformer.disable_lora()
    save({**m.meta, "kind": "lora-switch", "lora_rank": LORA_RANK, "lora_file_mib": size / 2**20,
          "set_adapters_s": sum(times) / len(times), "runs": runs,
          "note": "1-step jobs; while adapters are loaded the transformer runs eager"}, "extras")
