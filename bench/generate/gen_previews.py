"""``generate.py --previews N``: what previews cost a framefleet row, and how soon the
first one is there.

For each framefleet row the same job runs again with ``generate.preview = {"every": N}``, and
its row gets a ``previews`` object:

- ``overhead_pct``: the denoise's seconds with previews over the row's without, in % (the
  projection runs inside the denoise; the encodes run on the writer thread, outside it);
- ``first_preview_s``, ``first_step_end_s`` and ``second_step_end_s``: from the job's start
  (``run_job`` called) to the first preview stored and announced, and to the end of the first
  and second denoise steps (the default makes the first preview from step 1's latents, so the
  target is a preview no later than the end of step 2); ``first_preview_during_step``: the
  denoise step under way when it landed;
- ``latents_identical``: the latents with previews equal those without (the x0 watch never
  changes a step), ``count``, ``preview_s`` (the stage), the preview's size;
- ``png``: one frame (the middle one) of the last preview, written as a PNG next to the
  results, once per model; with random weights it is noise, but of the preview's size, and
  ``png_range`` gives each colour's min and max.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from producer.wire.spec import JobSpec, PreviewInfo, Progress
from worker.run import Run


class Clock:
    """The times the run's hooks see, from the job's start."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.step = 0
        self.step1_end: float | None = None
        self.step2_end: float | None = None
        self.first: float | None = None
        self.first_during: int | None = None
        self.last: PreviewInfo | None = None

    def attach(self, run: Run) -> None:
        self.t0 = time.perf_counter()
        run.progress_hooks.append(self._progress)
        run.preview_hooks.append(self._preview)

    def _progress(self, p: Progress) -> None:
        if p.stage != "denoise":
            return
        self.step = p.steps_done
        if p.steps_done >= 1 and self.step1_end is None:
            self.step1_end = time.perf_counter() - self.t0
        if p.steps_done >= 2 and self.step2_end is None:
            self.step2_end = time.perf_counter() - self.t0

    def _preview(self, p: PreviewInfo) -> None:
        if self.first is None:
            self.first = time.perf_counter() - self.t0
            self.first_during = self.step + 1
        self.last = p


def measure(m: Any, spec: JobSpec, row: dict[str, Any], latents: torch.Tensor, out: Path,
            stem: str) -> dict[str, Any]:
    """``spec``: the row's job with previews (``generate.preview``); its ``previews``
    object. ``latents``: the row's own, without previews."""
    from bench.generate.gen_runs import framefleet

    assert spec.generate is not None and spec.generate.preview is not None
    every = spec.generate.preview.every
    clock = Clock()
    ff = framefleet(spec, m.decoders, m.settings, watch=clock.attach)
    on, off = ff["denoise_s"], row["framefleet"]["denoise_s"]
    doc: dict[str, Any] = {
        "every": every, "denoise_s_off": off, "denoise_s_on": on,
        "overhead_pct": (on - off) / off * 100 if off else None,
        "first_preview_s": clock.first, "first_step_end_s": clock.step1_end,
        "second_step_end_s": clock.step2_end,
        "first_preview_during_step": clock.first_during,
        "first_preview_by_step2_end": (clock.first is not None and clock.step2_end is not None
                                       and clock.first <= clock.step2_end),
        "count": ff["previews"], "preview_s": ff["preview_s"],
        "latents_identical": bool(torch.equal(ff["latents"], latents)),
        "framefleet": {k: v for k, v in ff.items() if k not in ("latents", "segment_files")},
    }
    if clock.last is not None:
        last = clock.last
        doc["size"] = f"{last.width}x{last.height}x{last.frames}"
        png = out / f"{stem}-preview-{m.name}.png"
        if not png.exists():
            doc["png"], doc["png_range"] = png.name, write_png(last.uri, png)
    return doc


def write_png(uri: str, png: Path) -> dict[str, list[int]]:
    """The middle frame of the MP4 at ``uri`` (``file://``) as a PNG; each colour's range."""
    from PIL import Image

    from worker.pipeline.encode import read_frames_rgb

    frames = read_frames_rgb(Path(uri.removeprefix("file://")))
    frame = frames[len(frames) // 2]
    Image.fromarray(frame).save(png)
    flat = frame.reshape(-1, 3).astype(np.int64)
    return {"min": flat.min(0).tolist(), "max": flat.max(0).tolist()}


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown lines of the rows that measured previews (none: no lines)."""
    measured = [r for r in rows if "previews" in r]
    if not measured:
        return []
    lines = ["Previews (the same job again with `generate.preview`; times from the job's "
             "start):", "",
             "| model | steps | tier | every | denoise s off | on | overhead % | first preview "
             "s | step 1 end s | step 2 end s | landed in step | latents identical | PNG |",
             "|" + "---|" * 13]
    for r in measured:
        p = r["previews"]

        def f(v: Any, fmt: str = ".3f") -> str:
            return "-" if v is None else format(v, fmt)
        lines.append(
            f"| {r['model']} | {r['steps']} | {r['tier']} | {p['every']} | "
            f"{f(p['denoise_s_off'])} | {f(p['denoise_s_on'])} | {f(p['overhead_pct'], '.2f')} "
            f"| {f(p['first_preview_s'])} | {f(p.get('first_step_end_s'))} | "
            f"{f(p['second_step_end_s'])} | "
            f"{f(p['first_preview_during_step'], 'd')} | {p['latents_identical']} | "
            f"{p.get('png', '-')} |")
    return [*lines, ""]
