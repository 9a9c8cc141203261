"""Wan2.2's own VAE (TI2V-5B, full channel widths) on the fast path on a real GPU
(``pytest -m gpu``): the compiled, captured step is the same function as the eager one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from producer.wire.spec import PipelineSpec, VideoSpec
from worker.decoders.wan import WanDecoder, build_vae
from worker.pipeline import run_pipeline

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda", 0)
H, W = 12, 20  # latents of 192x320 frames: compile cost is per size, not per pixel


def _clip(decoder: WanDecoder, z: torch.Tensor) -> torch.Tensor:
    return torch.cat([c.float().clone() for c in decoder.stream(z)], dim=1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _uint8(x: torch.Tensor) -> torch.Tensor:
    return ((x + 1) * 127.5).round().to(torch.int16)


@pytest.fixture(scope="module")
def vae32() -> object:
    return build_vae("wan2.2", seed=0)


@pytest.fixture(scope="module")
def fast(vae32: object) -> WanDecoder:
    import copy

    vae = copy.deepcopy(vae32).to(torch.bfloat16)
    decoder = WanDecoder(vae, CUDA, graphs=2)
    t0 = time.perf_counter()
    decoder.warmup(H, W)
    print(f"wan2.2 bf16 warm-up (compile + capture) {time.perf_counter() - t0:.1f} s")
    assert decoder.graphs is not None
    decoder.graphs.wait(timeout=600)  # and the first-chunk graph, built in the background
    graph = decoder.graphs.get(decoder.graph_key(H, W))
    assert graph is not None and graph.first is not None
    return decoder


@pytest.mark.xdist_group("wan22-fp32")
def test_wan22_compiled_fp32_step_equals_eager(vae32: object) -> None:
    # (steady graph only: the first-chunk graph's fp32 equality is checked on Wan2.1, whose
    # first chunk runs the same step code; Wan2.2's first graph is checked in bf16 below)
    torch.backends.cudnn.allow_tf32 = False
    try:
        decoder = WanDecoder(vae32, CUDA, graphs=1, first_graph=False)
        decoder.warmup(8, 12)
        assert decoder.graphs is not None and decoder.graphs.get(decoder.graph_key(8, 12))
        z = torch.randn(48, 4, 8, 12, generator=torch.Generator().manual_seed(5))
        out = _clip(decoder, z)
        eager = _clip(WanDecoder(vae32, CUDA), z)
        with torch.inference_mode():
            ref = decoder.vae.decode(z[None].to(CUDA)).sample[0].float()
    finally:
        torch.backends.cudnn.allow_tf32 = True
    print(f"wan2.2 fp32 fast vs eager rel L2 {_rel(out, eager):.2e}, "
          f"eager vs diffusers {_rel(eager, ref):.2e}")
    assert out.shape == (3, 13, 128, 192)
    assert _rel(out, eager) < 1e-4
    assert _rel(eager, ref) < 1e-5


@pytest.mark.xdist_group("wan22")
def test_wan22_bf16_within_the_wan21_tolerance_of_fp32(fast: WanDecoder, vae32: object) -> None:
    z = torch.randn(48, 6, H, W, generator=torch.Generator().manual_seed(11))
    torch.backends.cudnn.allow_tf32 = False
    ref = _clip(WanDecoder(vae32, CUDA), z)
    torch.backends.cudnn.allow_tf32 = True
    eager = _clip(WanDecoder(fast.vae, CUDA), z)
    out = _clip(fast, z)
    rel_fast, rel_eager = _rel(out, ref), _rel(eager, ref)
    diff = int((_uint8(out) - _uint8(eager)).abs().max())
    print(f"wan2.2 rel L2 vs fp32: fast {rel_fast:.2e}, eager bf16 {rel_eager:.2e}; "
          f"max |Δ| uint8 vs eager {diff}")
    assert torch.isfinite(out).all()
    assert rel_fast < 3e-2 and rel_fast <= 1.1 * rel_eager
    assert diff <= 16
    first_fast, first_eager = _rel(out[:, :1], ref[:, :1]), _rel(eager[:, :1], ref[:, :1])
    print(f"wan2.2 first frame rel L2 vs fp32: fast {first_fast:.2e}, eager {first_eager:.2e}")
    # (one frame is a smaller sample than the clip: a looser factor, still far below broken)
    assert first_fast < 1e-1 and first_fast <= 1.5 * first_eager


@pytest.mark.xdist_group("wan22")
def test_wan22_async_and_sequential_give_identical_frames(fast: WanDecoder,
                                                          tmp_path: Path) -> None:
    z = torch.randn(48, 5, H, W, generator=torch.Generator().manual_seed(9))
    frames: dict[str, dict[int, torch.Tensor]] = {"async": {}, "sequential": {}}
    for mode, got in frames.items():
        (tmp_path / mode).mkdir()

        def tap(first: int, planes: torch.Tensor, got: dict[int, torch.Tensor] = got) -> None:
            for j in range(planes.shape[0]):
                got[first + j] = planes[j].clone()
        run_pipeline(fast, z, video=VideoSpec(segment_frames=8),
                     pipeline=PipelineSpec(mode=mode, ring_slots=2), scratch=tmp_path / mode,
                     sink=lambda s: None, frame_tap=tap)
    assert sorted(frames["async"]) == list(range(17))
    for k, plane in frames["sequential"].items():
        assert torch.equal(frames["async"][k], plane), f"frame {k} differs"
