"""The benchmark page's plots, drawn from the committed results in ``bench/results/``.

    python docs/plots.py            # writes docs/img/bench-*.png
    python docs/plots.py --out DIR  # elsewhere (tests/test_docs.py draws them into a temp folder)

Each plot reads the JSON a benchmark wrote (its command, date and device are in the file and
in the plot's title) and draws nothing else: a new run's JSON, committed, is a new plot after
one run of this script. Needs matplotlib (the ``plot`` extra; ``make install-test`` has it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
OUT = Path(__file__).resolve().parent / "img"


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((RESULTS / name).read_text()))


def _figure(v: float) -> str:
    """Three significant digits, never in exponent form (1220, not 1.22e+03)."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _bars(path: Path, title: str, labels: list[str], series: dict[str, list[float]],
          unit: str, note: str) -> None:
    """Horizontal grouped bars, one group per label, each bar with its value written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.55 * len(labels) * len(series)), dpi=110)
    height = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ys = [g + i * height for g in range(len(labels))]
        bars = ax.barh(ys, values, height=height * 0.9, label=name)
        ax.bar_label(bars, labels=[f"{_figure(v)} {unit}" for v in values], padding=3,
                     fontsize=8)
    ax.set_yticks([g + height * (len(series) - 1) / 2 for g in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_xlim(0, max(v for vs in series.values() for v in vs) * 1.25)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.text(0.01, 0.01, note, fontsize=6.5, color="#555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def decode(out: Path) -> Path:
    """The VAE decode alone: diffusers' eager ``vae.decode`` against the worker's decoder."""
    wan21 = _load("decode-h200.json")
    rows = {r["variant"]: r["wall_s"] for r in wan21["sizes"][0]["rows"]}
    size = wan21["sizes"][0]
    wan22 = next(m for m in _load("decode-subpixel-h200.json")["models"]
                 if m["preset"] == "wan2.2")
    rows22 = {r["variant"]: r["wall_s"] for r in wan22["rows"]}
    path = out / "bench-decode.png"
    _bars(path, f"VAE decode, bf16, on one {wan21['device']} (lower is better)",
          [f"Wan2.1 VAE, {size['size']}, {size['frames']} frames",
           f"Wan2.2 VAE, {wan22['size']}"],
          {"diffusers vae.decode": [rows["diffusers"], rows22["diffusers"]],
           "framefleet decoder": [rows["worker_fast_decoder"], rows22["fast:sub"]]},
          "s", "bench/results/decode-h200.json, decode-subpixel-h200.json "
          f"({wan21['date'][:10]})")
    return path


def denoise(out: Path) -> Path:
    """A whole Wan2.2 TI2V-5B job per speed tier against diffusers' pipeline."""
    runs = _load("denoise-h200-5b.json")
    rows = [r for name in ("denoise-h200-5b.json", "denoise-h200-5b-fp8.json")
            for r in _load(name)["rows"] if r["steps"] == 20]
    path = out / "bench-denoise.png"
    _bars(path, f"Wan2.2 TI2V-5B, {rows[0]['size']}, 20 steps, one {runs['device']} "
          "(lower is better)", [r["tier"] for r in rows],
          {"diffusers WanPipeline + export": [r["diffusers_wall_s"] for r in rows],
           "framefleet job": [r["framefleet_wall_s"] for r in rows]},
          "s", "bench/results/denoise-h200-5b.json, denoise-h200-5b-fp8.json "
          f"({runs['date'][:10]}; random weights)")
    return path


def first_segment(out: Path) -> Path:
    """Time from a job's start to its first segment in the live playlist."""
    runs = _load("ttfp-h200.json")
    sizes = sorted({r["size"] for r in runs["runs"]}, key=lambda s: int(s.split("x")[0]))
    by = {(r["size"], r["first_segment_frames"]): r for r in runs["runs"]}
    path = out / "bench-first-segment.png"
    _bars(path, f"Time to the first segment, 81 frames, one {runs['device']} (lower is better)",
          sizes, {f"first segment of {runs['segment_frames']} frames":
                  [by[(s, None)]["ttfp_s_median"] * 1000 for s in sizes],
                  "first_segment_frames: 1": [by[(s, 1)]["ttfp_s_median"] * 1000
                                              for s in sizes]},
          "ms", f"bench/results/ttfp-h200.json ({runs['date'][:10]})")
    return path


PLOTS: tuple[Callable[[Path], Path], ...] = (decode, denoise, first_segment)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the PNGs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for plot in PLOTS:
        print(plot(args.out))


if __name__ == "__main__":
    main()
