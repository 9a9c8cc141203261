"""WanStep: the Wan decoder as a pure function of (latent frame, history) equals vae.decode."""

from __future__ import annotations

import pytest
import torch

from worker.decoders.wan import WanDecoder, build_vae
from worker.decoders.wan_capture import advance_fn
from worker.decoders.wan_graph import ChunkGraph, ChunkGraphs, _DecoderWeights
from worker.decoders.wan_step import CACHE_T, WanStep, subpixel_conv, subpixel_kernel, supports
from worker.owner import DeviceOwner


def _decode(step: WanStep, z: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    chunks, caches = [], None
    with torch.inference_mode():
        for i in range(z.shape[2]):
            out, caches = step(z[:, :, i : i + 1], caches)
            chunks.append(out)
    assert caches is not None
    return torch.cat(chunks, dim=2), caches


@pytest.mark.parametrize(("batch", "latent_frames", "h", "w"), [(1, 1, 4, 6), (2, 5, 6, 10)])
def test_step_equals_vae_decode(batch: int, latent_frames: int, h: int, w: int) -> None:
    # Given the Wan architecture (tiny config, fp32) and random latents, batch > 1 too
    vae = build_vae("tiny", seed=3)
    z = torch.randn(batch, 16, latent_frames, h, w, generator=torch.Generator().manual_seed(7))
    # When decoded by diffusers in one call and by the pure step chunk by chunk
    with torch.inference_mode():
        reference = vae.decode(z).sample
    out, caches = _decode(WanStep(vae), z)
    # Then the frames are the same (the convolutions see the same numbers in the same order)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)
    # And after the first chunk every history entry holds exactly CACHE_T frames
    assert all(c.shape[0] == batch and c.shape[2] == CACHE_T for c in caches)


def test_stacked_time_conv_equals_conv3d() -> None:
    vae = build_vae("tiny", seed=1)
    z = torch.randn(1, 16, 4, 4, 6, generator=torch.Generator().manual_seed(2))
    plain, _ = _decode(WanStep(vae), z)
    stacked, _ = _decode(WanStep(vae, stack_time=True), z)
    torch.testing.assert_close(stacked, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("h", "w"), [(1, 1), (3, 5), (6, 4)])
def test_subpixel_conv_equals_nearest_upsample_then_conv(h: int, w: int) -> None:
    # Given a 3×3 conv (padding 1) after a nearest 2× upsample, as in Wan's resample blocks
    conv = torch.nn.Conv2d(6, 5, 3, padding=1)
    x = torch.randn(2, 6, h, w, generator=torch.Generator().manual_seed(h * 10 + w))
    reference = conv(torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest-exact"))
    # When run as one 2×2 conv with four channel blocks on the low-resolution input
    out = subpixel_conv(x, *subpixel_kernel(conv))
    # Then every output pixel is the same, borders included
    assert out.shape == reference.shape
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-5)


def test_subpixel_kernel_refuses_another_conv() -> None:
    with pytest.raises(ValueError, match="3×3 conv with padding 1"):
        subpixel_kernel(torch.nn.Conv2d(4, 4, 3, padding=0))


@pytest.mark.parametrize("preset", ["tiny", "tiny-wan2.2"])
def test_subpixel_step_equals_vae_decode(preset: str) -> None:
    # Given both Wan layouts (Wan2.2: upsamplers inside residual up blocks)
    vae = build_vae(preset, seed=4)
    c = vae.config.z_dim
    z = torch.randn(1, c, 3, 4, 6, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        reference = vae.decode(z).sample
    # When stepped with the sub-pixel upsample convs, also from the channels-last copy
    out, _ = _decode(WanStep(vae, subpixel=True), z)
    copied, _ = _decode(WanStep(_DecoderWeights(vae), subpixel=True),
                        z.contiguous(memory_format=torch.channels_last_3d))
    # Then the frames equal diffusers' (fp32: only the summation order differs)
    assert float((out - reference).norm() / reference.norm()) < 1e-5
    assert float((copied - reference).norm() / reference.norm()) < 1e-5
    # And the graphs' step takes the sub-pixel form from the tuning
    graphs = ChunkGraphs.for_vae(vae, torch.device("cpu"), capacity=0, compile=False,
                                 subpixel=True)
    assert sum(k is not None for k in graphs.step._subpixel) == sum(
        1 for up in vae.decoder.up_blocks
        if (up.upsampler if vae.config.get("is_residual") else up.upsamplers) is not None) > 0


def test_steady_chunk_compiles_as_one_graph_and_matches() -> None:
    # The point of the stateless step: torch.compile captures a whole steady-state chunk
    # (fullgraph=True fails on any graph break). aot_eager traces it exactly as inductor
    # would, without generating kernels (CPU CI; the GPU test compiles with inductor).
    vae = build_vae("tiny", seed=5)
    step = WanStep(vae)
    z = torch.randn(1, 16, 4, 4, 6, generator=torch.Generator().manual_seed(3))
    eager, _ = _decode(step, z)
    compiled = torch.compile(step.__call__, fullgraph=True, dynamic=False, backend="aot_eager")
    with torch.inference_mode():
        chunks = [step(z[:, :, :1])[0]]
        caches = step(z[:, :, :1])[1]
        for i in range(1, 4):
            out, caches = compiled(z[:, :, i : i + 1], caches)
            chunks.append(out)
    torch.testing.assert_close(torch.cat(chunks, dim=2), eager, rtol=0, atol=1e-6)


def test_channels_last_copy_decodes_the_same() -> None:
    vae = build_vae("tiny", seed=2)
    z = torch.randn(1, 16, 3, 4, 6, generator=torch.Generator().manual_seed(4))
    plain, _ = _decode(WanStep(vae), z)
    copied, _ = _decode(WanStep(_DecoderWeights(vae)),
                        z.contiguous(memory_format=torch.channels_last_3d))
    torch.testing.assert_close(copied, plain, rtol=0, atol=1e-5)
    # and the copy left the original weights alone
    assert all(p.is_contiguous() for p in vae.parameters())


def test_both_wan_layouts_are_stepped_and_a_patched_wan21_is_refused() -> None:
    # Wan2.1 (plain up blocks) and Wan2.2 (residual up blocks + patching) go through WanStep;
    # patching without residual blocks is no real architecture: refused, not guessed at.
    assert WanDecoder(build_vae("tiny")).step is not None
    assert WanDecoder(build_vae("tiny-wan2.2")).step is not None
    vae = build_vae("tiny")
    vae.register_to_config(patch_size=2)
    assert not supports(vae)
    with pytest.raises(ValueError, match="patching"):
        WanStep(vae)


@pytest.mark.parametrize("preset", ["tiny", "tiny-wan2.2"])
def test_history_written_in_place_equals_the_returned_history(preset: str) -> None:
    # The fused-history form (the compiled code writes the next history into the graph's
    # inputs) computes the same chunks as the step that returns its history; traced as one
    # graph (aot_eager: what inductor would compile, without kernels on the CPU).
    vae = build_vae(preset, seed=4)
    step = WanStep(vae)
    z = torch.randn(1, vae.config.z_dim, 4, 3, 5, generator=torch.Generator().manual_seed(8))
    eager, _ = _decode(step, z)
    advance = torch.compile(advance_fn(step), fullgraph=True, dynamic=False, backend="aot_eager")
    with torch.inference_mode():
        first, caches = step(z[:, :, :1])
        chunks = [first] + [advance(z[:, :, i : i + 1], caches) for i in range(1, 4)]
    torch.testing.assert_close(torch.cat(chunks, dim=2), eager, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_graph_body_leaves_the_next_history_in_its_inputs(fused: bool) -> None:
    # What a replay runs (without CUDA): one chunk whose next history lands in the static
    # history tensors, either copied after the step or written by the step itself.
    vae = build_vae("tiny-wan2.2", seed=6)
    step = WanStep(vae)
    graphs = ChunkGraphs(step, torch.device("cpu"), compile=False, fused_history=fused)
    z = torch.randn(1, 48, 3, 3, 4, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        _, caches = step(z[:, :, :1])
        expected, new = step(z[:, :, 1:2], caches)
        static = [c.clone() for c in caches]
        out = graphs._run(z[:, :, 1:2], static)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for s, n in zip(static, new, strict=True):
        torch.testing.assert_close(s, n, rtol=0, atol=0)


def test_cpu_decoder_has_no_graphs_and_zero_capacity_prepares_nothing() -> None:
    vae = build_vae("tiny")
    assert WanDecoder(vae, "cpu", graphs=2).graphs is None
    graphs = ChunkGraphs(WanStep(vae), torch.device("cpu"), capacity=0, compile=False)
    assert graphs.prepare((1, 16, 4, 4, torch.float32)) is None
    assert not graphs.prepare_later((1, 16, 4, 4, torch.float32))


class _RecordingGraphs(ChunkGraphs):
    """The cache's bookkeeping without CUDA: ``_capture`` records the key (or fails for keys in
    ``fail``) and returns an empty graph record; the real capture runs in tests/gpu."""

    def __init__(self, capacity: int, fail: tuple[object, ...] = ()) -> None:
        super().__init__(WanStep(build_vae("tiny")), torch.device("cpu"), capacity=capacity,
                         compile=False, owner=DeviceOwner())
        self.built: list[object] = []
        self.fail = fail

    def _capture(self, key):  # type: ignore[no-untyped-def]
        assert self.owner.holds()  # a build owns the device
        self.built.append(key)
        if key in self.fail:
            raise RuntimeError("capture failed")
        empty = torch.empty(0)
        return ChunkGraph(graph=None, z=empty, caches=[], out=empty, build_s=0.0)  # type: ignore[arg-type]


def _key(h: int) -> tuple[int, int, int, int, torch.dtype]:
    return (1, 16, h, h, torch.bfloat16)


def test_graph_cache_builds_once_and_evicts_least_recently_used() -> None:
    graphs = _RecordingGraphs(capacity=2)
    a, b, c = _key(4), _key(6), _key(8)
    assert graphs.prepare(a) is graphs.prepare(a) is not None
    graphs.prepare(b)
    assert graphs.get(a) is not None  # a is now the most recently used
    graphs.prepare(c)
    assert graphs.built == [a, b, c]
    assert graphs.get(b) is None and graphs.get(a) is not None and graphs.get(c) is not None


def test_failed_capture_leaves_the_size_eager_and_is_not_retried() -> None:
    graphs = _RecordingGraphs(capacity=2, fail=(_key(4),))
    assert graphs.prepare(_key(4)) is None
    assert graphs.prepare(_key(4)) is None and not graphs.prepare_later(_key(4))
    assert graphs.built == [_key(4)]


def test_background_build_starts_once_per_size() -> None:
    graphs = _RecordingGraphs(capacity=2)
    with graphs.owner.job():  # a job meets the size: the build waits for its end
        assert graphs.prepare_later(_key(4))
        assert not graphs.prepare_later(_key(4))  # queued: no second build
        assert graphs.built == []
    graphs.wait(timeout=30)
    assert not graphs.prepare_later(_key(4))  # built
    assert graphs.get(_key(4)) is not None and graphs.built == [_key(4)]


class _FlagGraphs(ChunkGraphs):
    """Records cuDNN's benchmark flag as a build sees it."""

    def __init__(self) -> None:
        super().__init__(WanStep(build_vae("tiny")), torch.device("cpu"), capacity=2,
                         compile=False, owner=DeviceOwner())
        self.seen: list[bool] = []

    def _capture_searched(self, key):  # type: ignore[no-untyped-def]
        self.seen.append(torch.backends.cudnn.benchmark)
        empty = torch.empty(0)
        return ChunkGraph(graph=None, z=empty, caches=[], out=empty, build_s=0.0)  # type: ignore[arg-type]


def test_cudnn_searches_algorithms_only_inside_a_build() -> None:
    # A job's eager decode at a size new to the process must not time every conv's algorithms
    # (the soak's first job at a new size spent 14.5 s decoding); a build's calls before its
    # capture must (the graph keeps the fastest).
    assert torch.backends.cudnn.benchmark is False
    graphs = _FlagGraphs()
    assert torch.backends.cudnn.benchmark is False  # making the cache does not switch it on
    graphs.prepare(_key(4))
    assert graphs.seen == [True]
    assert torch.backends.cudnn.benchmark is False
