"""Every job id the benchmarks make is a valid ``JobSpec`` id (``[A-Za-z0-9._-]``): on the H200
the bench's fp8+cache row died after six minutes of rows on ``bench-...-fp8+cache-20``. The ids
come from one function, ``bench_id``; here every row of generate.py at every preset, tier and
step count, and every job of the GPU soak's plan over several rounds, is built and validated."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.generate.gen_specs import bench_id, gen_spec, job
from bench.soak.soak_plan import Setup, round_items
from producer.wire.spec import check_id
from worker.generate.model.presets import PRESETS

TIERS = ["exact", "cache", "fp8", "fp8+cache"]


@pytest.mark.parametrize("tier", TIERS)
def test_every_generate_row_id_is_valid(tmp_path: Path, tier: str) -> None:
    for name, preset in PRESETS.items():
        for steps in (1, 4, 20):
            # the tags generate.py and its previews give a row (gen_extra's are fixed words)
            for tag in (f"{tier}-warm", f"{tier}-{steps}", f"{tier}-{steps}-pv2"):
                spec = job(tmp_path, name, gen_spec(tmp_path / name, preset.default_size, steps,
                                                    tier), tag)
                assert check_id(spec.job_id, "job_id") == spec.job_id
                assert spec.generate is not None
                assert spec.generate.tier == ("fp8" if tier.startswith("fp8") else "exact")
                assert (spec.generate.cache is not None) == tier.endswith("cache")


def test_bench_id_keeps_valid_parts_and_replaces_the_rest() -> None:
    got = bench_id("bench", "wan2.2-ti2v-5b", "fp8+cache-20")
    assert got == "bench-wan2.2-ti2v-5b-fp8-cache-20"
    assert bench_id("r1", "5b-480x832x49-exact-42") == "r1-5b-480x832x49-exact-42"
    assert bench_id("a b", "c/d", "e:f") == "a-b-c-d-e-f"
    with pytest.raises(ValueError, match="job_id"):
        bench_id("x" * 200)


def test_every_job_of_the_gpu_soak_plan_is_valid(tmp_path: Path) -> None:
    """The GPU soak's plan (bench/soak/soak_inputs.py's sizes and all four tiers), rounds 1-4:
    each tier meets each 5B size, so every id shape the device soak makes is built here."""
    setup = Setup(big=tmp_path / "big", small=tmp_path / "small", out=(tmp_path / "o").as_uri(),
                  image=tmp_path / "first.png",
                  loras=[tmp_path / "l0.safetensors", tmp_path / "l1.safetensors"],
                  hostile=tmp_path / "hostile", hog=tmp_path / "hog.npy",
                  decode_inputs=[("wan2.2-vae", tmp_path / "d0.npy", 33)],
                  big_sizes=[(480, 832, 49), (704, 1280, 33)],
                  small_sizes=[(480, 832, 33), (320, 576, 33)], steps=8, long_steps=20,
                  cancel_steps=80, tiers=TIERS)
    ids = [item.spec.job_id for r in range(1, 5) for item in round_items(setup, r)]
    assert len(ids) == len(set(ids))  # no two jobs of the soak share an id
    tiers = {item.meta["tier"] for r in range(1, 5) for item in round_items(setup, r)
             if item.meta}
    assert tiers == set(TIERS)
    assert all(check_id(i, "job_id") for i in ids)
    assert "r2-5b-704x1280x33-fp8-cache-42" in ids
