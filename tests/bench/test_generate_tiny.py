"""bench/generate/generate.py --tiny runs on the CPU (the 1.3B and TI2V-5B layouts in
miniature), the same code paths as on the GPU: the exact tier's latents equal diffusers', the
cached tier is measured against it, fp8 is skipped with the reason, JSON and table written;
``--previews`` measures each row again with previews and writes a preview frame as a PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_generate_tiny(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "generate" / "generate.py"), "--tiny", "--tiers",
         "exact,fp8,cache", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "generate.json").read_text())
    assert {"command", "date", "device", "rows"} <= set(doc)
    assert [(r["model"], r["steps"], r["tier"]) for r in doc["rows"]] == [
        ("tiny-ti2v", 4, "exact"), ("tiny-ti2v", 4, "cache"), ("tiny", 4, "exact"),
        ("tiny", 4, "cache")]
    for row in doc["rows"]:
        assert row["framefleet_wall_s"] > 0 and row["diffusers_wall_s"] > 0
        assert row["speedup"] == row["diffusers_wall_s"] / row["framefleet_wall_s"]
        assert row["denoise_s_per_step"] > 0
        if row["tier"] == "exact":  # eager on the CPU: diffusers' latents, bit for bit
            assert row["latents_identical_to_diffusers"] is True
            assert row["quality"]["latents_rel_l2"] == 0
        else:  # the cache skipped steps: a measured difference, frames compared
            assert 0 < row["quality"]["latents_rel_l2"] < 1
            assert row["quality"]["frames_psnr_db"] > 10
    assert [c["forward_rel_l2"] for c in doc["checks"]] == [0.0, 0.0]
    assert [s["what"] for s in doc["skipped"]] == ["tiny-ti2v fp8", "tiny fp8"]
    assert all("generate.tier: fp8 needs a GPU" in s["reason"] for s in doc["skipped"])
    assert "| tiny-ti2v | 64x64x9 | 4 | exact |" in done.stdout


def test_bench_generate_tiny_with_previews(tmp_path: Path) -> None:
    from PIL import Image

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "generate" / "generate.py"), "--tiny", "--tiers",
         "exact", "--previews", "2", "--json", "pv.json", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "pv.json").read_text())
    sizes = {"tiny-ti2v": (16, 16), "tiny": (24, 16)}  # the latent grids x4
    assert [r["model"] for r in doc["rows"]] == list(sizes)
    for row in doc["rows"]:
        p = row["previews"]
        # the same job with a preview every 2 of its 4 steps: after steps 1, 2 and 4, the same
        # latents
        assert p["every"] == 2 and p["count"] == 3 and p["latents_identical"] is True
        assert p["denoise_s_off"] == row["framefleet"]["denoise_s"] and p["denoise_s_on"] > 0
        assert p["overhead_pct"] == (p["denoise_s_on"] - p["denoise_s_off"]) / p[
            "denoise_s_off"] * 100
        assert 0 < p["second_step_end_s"] < row["framefleet_wall_s"] * 2
        assert 0 < p["first_preview_s"] and p["first_preview_during_step"] >= 2
        assert p["preview_s"] > 0
        # one preview frame per model, a PNG next to the results, of the preview's size
        w, h = sizes[row["model"]]
        assert p["size"] == f"{w}x{h}x3"
        with Image.open(tmp_path / p["png"]) as png:
            assert png.size == (w, h) and png.mode == "RGB"
        assert all(0 <= lo <= hi <= 255 for lo, hi in zip(p["png_range"]["min"],
                                                          p["png_range"]["max"], strict=True))
    assert "| tiny | 4 | exact | 2 |" in (tmp_path / "pv.md").read_text()
