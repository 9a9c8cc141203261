"""The tables ``generate.py`` writes: one row per (model, steps, tier), the checks, the
image-to-video and LoRA rows, the previews, and what was skipped."""

from __future__ import annotations

import json
from typing import Any

from bench.generate import gen_previews
from bench.generate.attn_report import split_table


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| model | size | steps | tier | ff wall s | diffusers wall s | speed-up | "
            "denoise s/step | latents rel L2 | frames PSNR dB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        q = r["quality"]
        psnr = q.get("frames_psnr_db")
        lines.append(
            f"| {r['model']} | {r['size']} | {r['steps']} | {r['tier']} | "
            f"{r['framefleet_wall_s']:.2f} | {r['diffusers_wall_s']:.2f} | {r['speedup']:.2f}x | "
            f"{r['denoise_s_per_step']:.3f} | {_num(q.get('latents_rel_l2'), '.2e')} | "
            f"{'-' if psnr is None else f'{psnr:.1f}'} |")
    return "\n".join(lines)


def markdown(doc: dict[str, Any]) -> str:
    """The results' markdown: what ran, the table, the checks, what was skipped."""
    lines = [
        "# Generate jobs per speed tier against diffusers", "",
        f"`{doc['command']}`, {doc['date']}, {doc['device']} (torch {doc['torch']}, "
        f"diffusers {doc['diffusers']}).", "",
        "The weights are random (seeded), at the real architectures: the speeds are those of "
        "the real models, but the quality columns (rel L2 of the final latents, PSNR of the "
        "decoded frames, each against the exact tier at the same seed) measure the "
        "arithmetic's error only, not a model's visual quality.", "",
        f"The `cache` tier is the exact tier with `{json.dumps(doc['recommended_cache'])}`.", "",
        table(doc["rows"]), "", "Checks (one transformer forward against eager):", "",
        *(f"- {c['model']} {c['tier']}: rel L2 {c['forward_rel_l2']:.2e}"
          + (f", prepared in {c['prepare_s']:.1f} s" if "prepare_s" in c else "")
          for c in doc["checks"]), "",
        "Image-to-video and LoRA rows (full figures in the JSON):", "",
        *("- " + json.dumps({k: v for k, v in e.items() if k not in ("framefleet", "diffusers")},
                            default=str) for e in doc["extras"]), "",
        *gen_previews.table(doc["rows"]), *split_table(doc.get("split", [])),
        *(f"- skipped: {k['what']}: {k['reason']}" for k in doc["skipped"]),
    ]
    return "\n".join(lines) + "\n"
