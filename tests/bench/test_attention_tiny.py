"""bench/generate/attention.py --tiny runs on the CPU with every option of its device run
(``--compile --forward``): the exact kernels against float32, the reference 8-bit attention
(the CPU's stand-in for cuDNN's) with a real float8 error, the GEMMs in bf16 and float8, the
flash impls torch lists with why they did not activate, one whole forward with the 8-bit
attention; and generate.py's ``--split`` gives each tier's forward by kernel class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.generate.gen_split import classify

ROOT = Path(__file__).resolve().parents[2]
#: The device call's options (bench/results/attention-*.md names the command).
DEVICE = ["--compile", "--reps", "4", "--forward", "wan2.2-ti2v-5b", "--json", "attention.json"]


def _run(script: str, args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "generate" / script), "--tiny",
                           *args, "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_attention_bench_tiny(tmp_path: Path) -> None:
    done = _run("attention.py", DEVICE, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "attention.json").read_text())
    rows = {r["kernel"]: r for r in doc["attention"]}
    assert set(rows) == {"default", "math", "attn8:reference"}
    assert rows["default"]["rel_err"] < 1e-5 and rows["math"]["rel_err"] < 1e-5
    assert 5e-3 < rows["attn8:reference"]["rel_err"] < 0.1  # float8: real, bounded
    assert all(r["ms"] > 0 and r["tflops"] > 0 for r in rows.values())
    gemm = doc["gemms"][0]
    assert gemm["bf16_rel_err"] < 1e-5 and 1e-3 < gemm["fp8_rel_err"] < 0.1
    assert gemm["fp8+quantise_rel_err"] == gemm["fp8_rel_err"]  # the compiled quantise: same
    assert doc["attn8_cudnn"] == "no CUDA device"
    assert all(why for why in doc["flash_impls"].values())  # no FA3/FA4 package here
    forward = doc["forward"]
    assert [(f["model"], f["forward"], f["kernel"]) for f in forward] == [
        ("tiny-ti2v", "attn8", "reference")]
    assert forward[0]["finite"] and 1e-4 < forward[0]["rel_l2_vs_exact"] < 0.05
    text = (tmp_path / "attention.md").read_text()
    assert "| tiny | 2 | 320 | attn8:reference |" in text and "| tiny-ti2v | 64x64x9 |" in text


def test_generate_split_tiny(tmp_path: Path) -> None:
    done = _run("generate.py", ["--tiers", "exact", "--steps", "4", "--split",
                                "--decode-graphs", "0", "--json", "split.json"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    split = json.loads((tmp_path / "split.json").read_text())["split"]
    assert [(s["model"], s["tier"]) for s in split] == [("tiny-ti2v", "exact"), ("tiny", "exact")]
    for s in split:
        assert abs(sum(s["share"].values()) - 1) < 1e-9 and s["total_ms"] > 0
        assert s["ms"]["attention"] > 0 and s["ms"]["gemm"] > 0  # both found by name
    assert "| tiny | 48x32x9 | exact |" in (tmp_path / "split.md").read_text()


def test_kernel_names_are_classified() -> None:
    assert classify("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") \
        == "attention"
    assert classify("framefleet_attn::attn8_cudnn") == "attention"
    assert classify("nvjet_sm90_tst_192x208_64x4_2x1_v_bz_coopB_bias_TNT") == "gemm"
    assert classify("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128") == "gemm"
    assert classify("aten::addmm") == "gemm"
    assert classify("triton_poi_fused__to_copy_abs_amax_clamp_div_0") == "other"
    assert classify("void at::native::vectorized_layer_norm_kernel<float>") == "other"


def test_split_inputs_take_the_models_dtype_not_its_first_parameters() -> None:
    """A Wan transformer keeps ``scale_shift_table`` in float32 and lists it first: the inputs
    are the model's dtype (bf16 on a GPU), or its patch embedding refuses them (seen on an
    H100: "Input type (float) and bias type (c10::BFloat16) should be the same")."""
    import types

    import torch
    from diffusers import WanTransformer3DModel

    from bench.generate.gen_split import _inputs
    from worker.generate.model.presets import PRESETS, cast

    model = cast(WanTransformer3DModel(**PRESETS["tiny-ti2v"].transformer), torch.bfloat16)
    assert next(model.parameters()).dtype == torch.float32
    info = types.SimpleNamespace(temporal_factor=4, spatial_factor=16)
    args = _inputs(model, PRESETS["tiny-ti2v"].default_size, info, torch.device("cpu"))
    assert args["hidden_states"].dtype == torch.bfloat16
    with torch.no_grad():
        assert model(**args)[0].dtype == torch.bfloat16
