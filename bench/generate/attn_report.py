"""The tables of the attention bench (``attention.py``) and of a step's split by kernel class
(``gen_split.py``, in the generate bench's report)."""

from __future__ import annotations

from typing import Any


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def attention_markdown(doc: dict[str, Any]) -> str:
    """The attention bench's markdown: what ran, the peaks, a row per (shape, kernel), the
    GEMMs, and the flash impls that did not activate."""
    peaks = doc["peaks"]
    lines = [
        "# Attention and GEMM kernels at the Wan shapes", "",
        f"`{doc['command']}`, {doc['date']}, {doc['device']} (torch {doc['torch']}, cuDNN "
        f"{doc['cudnn']}).", "",
        f"Matrix units on an n³ product of random data: bf16 "
        f"{_f(peaks.get('bf16_tflops'), '.0f')} TFLOP/s, float8 "
        f"{_f(peaks.get('fp8_tflops'), '.0f')} TFLOP/s. cuDNN's float8 attention: "
        f"{doc['attn8_cudnn']}. Errors: rel L2 against float32 on the first heads.", "",
        "| shape | heads | tokens | kernel | ms | TFLOP/s | rel err |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["attention"]:
        if "error" in r:
            lines.append(f"| {r['shape']} | {r['heads']} | {r['tokens']} | {r['kernel']} | "
                         f"failed: {r['error'][:120]} | | |")
            continue
        lines.append(f"| {r['shape']} | {r['heads']} | {r['tokens']} | {r['kernel']} | "
                     f"{r['ms']:.2f} | {r['tflops']:.0f} | {r['rel_err']:.2e} |")
    lines += ["", "| GEMM | M x K -> N | bf16 ms (TFLOP/s, err) | fp8 ms (TFLOP/s, err) | "
              "fp8 + its quantise ms (TFLOP/s, err) |", "|---|---|---|---|---|"]
    for g in doc["gemms"]:
        cells = []
        for label in ("bf16", "fp8", "fp8+quantise"):
            if f"{label}_ms" not in g:
                cells.append(f"failed: {g.get(f'{label}_error', '?')[:80]}")
                continue
            cells.append(f"{g[f'{label}_ms']:.2f} ({g[f'{label}_tflops']:.0f}, "
                         f"{g[f'{label}_rel_err']:.1e})")
        lines.append(f"| {g['gemm']} | {g['m']} x {g['k']} -> {g['n']} | " + " | ".join(cells)
                     + " |")
    if doc.get("forward"):
        lines += ["", "A whole transformer forward (eager) against the exact tier's:", "",
                  "| model | size | forward | 8-bit kernel | rel L2 vs exact | finite |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['size']} | {r['forward']} | {r['kernel']} | "
                  f"{r['rel_l2_vs_exact']:.2e} | {r['finite']} |" for r in doc["forward"]]
    lines += ["", *(f"- flash impl {impl}: " + ("activated" if why is None else f"not "
                                               f"activated: {why}")
                    for impl, why in doc["flash_impls"].items())]
    return "\n".join(lines) + "\n"


def split_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (model, size, tier): a transformer forward's device time by kernel
    class (``gen_split``)."""
    if not rows:
        return []
    lines = ["A transformer forward by kernel class (torch profiler, one forward at the row's "
             "size, compiled as the tier runs it):", "",
             "| model | size | tier | forward ms | attention | GEMM | other |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        share = r["share"]
        lines.append(f"| {r['model']} | {r['size']} | {r['tier']} | {r['total_ms']:.1f} | "
                     + " | ".join(f"{share[c] * 100:.1f} % ({r['ms'][c]:.1f} ms)"
                                  for c in ("attention", "gemm", "other")) + " |")
    return [*lines, ""]
