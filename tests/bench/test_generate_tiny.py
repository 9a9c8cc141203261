"""bench/generate/generate.py --tiny runs on the CPU (the 1.3B and TI2V-5B layouts in
miniature) with the options the device runs use, the same code paths as on the GPU: the exact
tier's latents equal diffusers', the cached tier is measured against it, the fp8 rows' jobs go
to the worker's refusal (recorded with the reason), JSON and table written; ``--previews``
measures each row again with previews and writes a preview frame as a PNG. Every job id a row
can make is a valid ``JobSpec`` id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


#: ``STAGE=bench`` of bench/gpu_trust.sh, option for option (its budget: what a call leaves).
DEVICE_BENCH = ["--steps", "20,4", "--order", "steps", "--tiers", "exact,cache,fp8,fp8+cache",
                "--decode-graphs", "1", "--budget-s", "530", "--json", "denoise-tiny.json"]


def test_bench_generate_tiny(tmp_path: Path) -> None:
    """The bench stage's command at tiny size: every row, the fp8 ones to the worker's refusal."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "generate" / "generate.py"), "--tiny",
         *DEVICE_BENCH, "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "denoise-tiny.json").read_text())
    assert {"command", "date", "device", "rows"} <= set(doc)
    assert (tmp_path / "denoise-tiny.md").read_text().startswith("# Generate jobs")
    assert [(r["model"], r["steps"], r["tier"]) for r in doc["rows"]] == [
        (m, s, t) for m in ("tiny-ti2v", "tiny") for s in (20, 4) for t in ("exact", "cache")]
    for row in doc["rows"]:
        assert row["job_id"] == f"bench-{row['model']}-{row['tier']}-{row['steps']}"
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
    # the fp8 rows: built, validated and sent through run_job to the worker's own refusal
    assert [(s["what"], s["job_id"]) for s in doc["skipped"]] == [
        (f"{m} {s} steps {t}", f"bench-{m}-{t.replace('+', '-')}-{s}")
        for m in ("tiny-ti2v", "tiny") for s in (20, 4) for t in ("fp8", "fp8+cache")]
    assert all("generate.tier: fp8 needs a GPU" in s["reason"] for s in doc["skipped"])
    assert not doc["failed"]
    assert "| tiny-ti2v | 64x64x9 | 20 | exact |" in done.stdout


def test_bench_generate_tiny_with_previews(tmp_path: Path) -> None:
    """The previews device call (``--steps 20 --tiers exact --previews 2 --decode-graphs 1``)."""
    from PIL import Image

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "generate" / "generate.py"), "--tiny", "--tiers",
         "exact", "--steps", "20", "--previews", "2", "--decode-graphs", "1", "--json", "pv.json",
         "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "pv.json").read_text())
    sizes = {"tiny-ti2v": (16, 16), "tiny": (24, 16)}  # the latent grids x4
    assert [r["model"] for r in doc["rows"]] == list(sizes)
    for row in doc["rows"]:
        p = row["previews"]
        # the same job with a preview after step 1, then every 2 of its 20 steps: eleven
        # previews at most (one that finds the writer busy is dropped by design, as on a
        # loaded CPU: the denoise never waits for a preview), the same latents
        assert p["every"] == 2 and 1 <= p["count"] <= 11 and p["latents_identical"] is True
        assert p["denoise_s_off"] == row["framefleet"]["denoise_s"] and p["denoise_s_on"] > 0
        assert p["overhead_pct"] == (p["denoise_s_on"] - p["denoise_s_off"]) / p[
            "denoise_s_off"] * 100
        assert 0 < p["first_step_end_s"] < p["second_step_end_s"] < row["framefleet_wall_s"] * 2
        assert 0 < p["first_preview_s"] and p["first_preview_during_step"] >= 2
        assert p["preview_s"] > 0
        # one preview frame per model, a PNG next to the results, of the preview's size
        w, h = sizes[row["model"]]
        assert p["size"] == f"{w}x{h}x3"
        with Image.open(tmp_path / p["png"]) as png:
            assert png.size == (w, h) and png.mode == "RGB"
        assert all(0 <= lo <= hi <= 255 for lo, hi in zip(p["png_range"]["min"],
                                                          p["png_range"]["max"], strict=True))
    assert "| tiny | 20 | exact | 2 |" in (tmp_path / "pv.md").read_text()


def test_bench_generate_tiny_fp8_stage(tmp_path: Path) -> None:
    """``STAGE=fp8`` of bench/gpu_trust.sh, option for option: the fp8 rows alone, so no exact
    forward check; on the CPU both go to the worker's refusal after diffusers' baseline ran."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "generate" / "generate.py"), "--tiny",
         "--steps", "20", "--tiers", "fp8,fp8+cache",
         "--decode-graphs", "1", "--budget-s", "530", "--json", "fp8-tiny.json",
         "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "fp8-tiny.json").read_text())
    assert doc["rows"] == [] and doc["checks"] == [] and not doc["failed"]
    assert [s["what"] for s in doc["skipped"]] == [
        f"{m} 20 steps {t}" for m in ("tiny-ti2v", "tiny") for t in ("fp8", "fp8+cache")]
    assert all("generate.tier: fp8 needs a GPU" in s["reason"] for s in doc["skipped"])


def test_a_row_without_the_exact_reference_says_so(tmp_path: Path) -> None:
    """A cache row in a run without the exact tier has no exact reference: its latents'
    error against exact is unknown (None, "-" in the table), not 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "generate" / "generate.py"), "--tiny",
         "--steps", "4", "--tiers", "cache", "--json", "cache.json",
         "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "cache.json").read_text())["rows"]
    assert [(r["model"], r["tier"]) for r in rows] == [("tiny-ti2v", "cache"), ("tiny", "cache")]
    for row in rows:
        assert row["quality"]["latents_rel_l2"] is None
        assert row["quality"]["vs_diffusers_rel_l2"] > 0  # the skipped steps, against diffusers
    assert "| tiny | 48x32x9 | 4 | cache |" in done.stdout
    assert done.stdout.rstrip().endswith("| - | - |")  # no rel L2, no PSNR against exact
