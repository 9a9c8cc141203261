"""``framefleet compile``: compile a model folder at its tiers and sizes, as a worker's
warm-up does, and write one compile artifact per tier (``worker.generate.model.artifacts``).

The same path as the worker's start (``worker.generate.model.warm.compile_size``: one denoise
step per size through the resident pipeline; then, on CUDA, the decoder's two graphs at each
size's latent size, ``worker.generate.model.graphs``), so the artifact holds everything a
worker's warm-up compiles: a worker with a fresh compile cache and the artifact compiles
nothing. Run it once per release on the GPU kind the fleet runs (an artifact is valid for one
torch + Triton version and one GPU name); on the CPU it compiles the transformer with
inductor's C++ backend (the decoder's graphs are CUDA graphs: none on the CPU).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from producer.settings import Settings
from worker.generate.model import artifacts, graphs
from worker.generate.model.cache import ModelCache
from worker.generate.model.warm import compile_size, parse_video_sizes
from worker.generate.request.folder import model_folder, read_model
from worker.generate.tier.tiers import check_tier

log = logging.getLogger(__name__)


def compile_model(model: str, tiers: list[str], sizes: str, out: str | None,
                  settings: Settings, device: torch.device) -> list[dict[str, Any]]:
    """Compile ``model`` at each tier and size; write each tier's artifact into ``out``
    (default: the model folder's ``compiled/``). Returns one row per tier: its stamp, the
    seconds of each size, inductor's FX graph cache counters, where it was written (or why
    not)."""
    info = read_model(model_folder(model))
    parsed = parse_video_sizes(sizes)
    if not parsed:
        raise ValueError("--sizes: give at least one HxWxF size")
    place = artifacts.Place(out or str(info.path / "compiled"), settings)
    limit = settings.compile_artifact_max_mib * 1024**2
    latents = len({(h, w) for h, w, _ in parsed})
    models = ModelCache(device, 2**62, compiled_sizes=len(parsed), compile_cpu=True,
                        load_method=settings.load_method, load_threads=settings.load_threads,
                        graphs=max(settings.decode_graphs, latents))
    rows = []
    for tier in tiers:
        check_tier(tier, device)
        stamp = artifacts.stamp_for(info.path, tier, device)
        entry = models.get(info.path, models.resolve_dtype("auto"), tier, info.pipeline)
        artifacts.start_recording()
        before = artifacts.graph_counters()
        row: dict[str, Any] = {"tier": tier, "device": stamp.device, "torch": stamp.torch,
                               "triton": stamp.triton, "config": stamp.config, "sizes": {}}
        for h, w, f in parsed:
            t = time.perf_counter()
            compile_size(models, entry, info, h, w, f)
            row["sizes"][f"{h}x{w}x{f}"] = round(time.perf_counter() - t, 3)
        after = artifacts.graph_counters()
        row["fxgraph"] = {k: after[k] - before[k] for k in after}
        row["graphs"] = _decoder_graphs(models, entry, parsed)
        written = artifacts.save(place, stamp, list(row["sizes"]), limit,
                                 [k for k, v in row["graphs"].items() if v["captured"]])
        row["written"] = place.uri(written.file) if written is not None else None
        if written is not None:
            row["bytes"], row["sha256"] = written.bytes, written.sha256
        else:
            row["kept"] = "an artifact covering these sizes is there already"
        rows.append(row)
        models.evict_others(entry)  # one tier resident at a time
    return rows


def _decoder_graphs(models: ModelCache, entry: Any,
                    sizes: list[tuple[int, int, int]]) -> dict[str, dict[str, Any]]:
    """(CUDA, decode graphs on) The decoder's steady and first-chunk graphs at each size's
    latent size, built now: name → seconds, FX graph cache counters, captured. None on the
    CPU: they are CUDA graphs."""
    if models.device.type != "cuda" or models.graphs <= 0:
        return {}
    outcomes, _ = graphs.build(models.decoder(entry), graphs.latent_sizes(entry.pipe.vae, sizes))
    return outcomes


def describe(rows: list[dict[str, Any]], where: str | Path) -> str:
    """One line per tier, for the command's output."""
    lines = []
    for row in rows:
        sizes = ", ".join(f"{k} {v:.1f} s" for k, v in row["sizes"].items())
        built = ", ".join(f"{k} {v['seconds']:.1f} s" + ("" if v["captured"] else
                                                         " (not captured)")
                          for k, v in row["graphs"].items())
        what = (f"wrote {row['written']} ({row['bytes']} bytes)" if row["written"]
                else f"kept the artifact in {where}: it covers these sizes already")
        lines.append(f"{row['tier']} on {row['device']} (torch {row['torch']}, triton "
                     f"{row['triton']}): compiled {sizes}; decoder graphs "
                     f"{built or 'none (CUDA only)'}; {what}")
    return "\n".join(lines)
