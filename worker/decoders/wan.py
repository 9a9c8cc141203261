"""Wan VAE decoders (diffusers ``AutoencoderKLWan``), streamed one latent frame at a time.

Two architectures: Wan2.1's (16 latent channels, 8× spatial; also the VAE of Wan2.2's A14B
models) and Wan2.2's own (TI2V-5B: 48 latent channels, residual up blocks, 2×2 patching,
16× spatial). Both go through the same pure step and graphs.

diffusers' own ``_decode`` runs the decoder per latent frame with a causal feature cache and
concatenates everything into one video tensor: memory grows with video length. ``stream``
yields each chunk instead, so the pipeline can post-process, copy and encode chunk i while
chunk i+1 decodes, and memory stays flat. Chunks come from ``WanStep`` (the same decoder as a
pure function of its history); on CUDA every chunk replays a compiled, captured graph once one
exists for the size (``wan_graph``: the steady chunks' graph first, the first chunk's graph
built in the background after it), else runs eagerly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from producer.errors import InvalidJobError
from worker.decoders.base import SPATIAL_RATIO
from worker.decoders.wan_graph import ChunkGraphs, Key
from worker.decoders.wan_step import WanStep, supports
from worker.owner import DEVICE

#: The real Wan2.1 VAE architecture (diffusers' defaults).
WAN21: dict[str, Any] = {}
#: A few-channel version of the same architecture: for tests and the CPU demo.
TINY: dict[str, Any] = {"base_dim": 8, "num_res_blocks": 1}
#: Wan2.2 TI2V-5B's VAE: its diffusers ``vae/config.json`` (the latent statistics are kept for
#: completeness; decoding does not use them).
WAN22: dict[str, Any] = {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2, "attn_scales": [], "temperal_downsample": [False, True, True],
    "dropout": 0.0, "is_residual": True, "in_channels": 12, "out_channels": 12, "patch_size": 2,
    "scale_factor_temporal": 4, "scale_factor_spatial": 16,
    "latents_mean": [
        -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542,
        0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,
        0.2665, -0.2108, -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899,
        -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
        0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667],
    "latents_std": [
        0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344,
        0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804,
        0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999,
        0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
        0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744],
}
#: The Wan2.2 architecture with few channels (48 latent channels kept): tests and demos.
TINY22: dict[str, Any] = {
    **{k: v for k, v in WAN22.items() if not k.startswith("latents_")},
    "base_dim": 8, "decoder_base_dim": 8, "num_res_blocks": 1,
}
PRESETS = {"wan2.1": WAN21, "tiny": TINY, "wan2.2": WAN22, "tiny-wan2.2": TINY22}
#: The decoder (``DecoderSpec.name``) each preset is an architecture of.
FAMILY = {"wan2.1": "wan2.1-vae", "tiny": "wan2.1-vae", "wan2.2": "wan2.2-vae",
          "tiny-wan2.2": "wan2.2-vae"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_vae(
    preset: str = "wan2.1", weights_dir: str | None = None, seed: int = 0,
    dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
) -> Any:
    """``from_pretrained`` of a local diffusers-layout folder, else a seeded random init.

    ``device``: where the model is built. A random init runs there (on a GPU in a fraction of
    a second; the same seed gives other weights on a GPU than on the CPU, each reproducible);
    None builds on the CPU."""
    from diffusers import AutoencoderKLWan

    where = torch.device(device) if device is not None else torch.device("cpu")
    if weights_dir is not None:
        # diffusers' default loading (mmap, then one copy to the device) is already fast:
        # 0.27 s for the 1.4 GB Wan2.2 folder on an H200 (bench/results/load-probe-h200.log).
        try:
            vae = AutoencoderKLWan.from_pretrained(weights_dir, torch_dtype=dtype)
        except (OSError, ValueError) as e:
            raise InvalidJobError(f"decoder.weights: cannot load {weights_dir}: {e}") from e
        expected = FAMILY.get(preset)
        if expected is not None and decoder_name(vae) != expected:
            raise InvalidJobError(
                f"decoder.weights: {weights_dir} holds a {decoder_name(vae)} model, "
                f"the job asks for {expected}")
        vae = vae.to(where)
    else:
        if preset not in PRESETS:
            raise InvalidJobError(f"decoder.preset: unknown preset {preset!r}")
        # The caller's random streams are left as they were.
        with torch.random.fork_rng(devices=[where] if where.type == "cuda" else []), where:
            torch.manual_seed(seed)
            model: Any = AutoencoderKLWan(**PRESETS[preset])
        vae = model if dtype == torch.float32 else model.to(dtype)
    return vae.eval().requires_grad_(False)


def decoder_name(vae: Any) -> str:
    """The spec's decoder name for a model's architecture (``DecoderSpec.name``)."""
    return "wan2.2-vae" if vae.config.get("is_residual", False) else "wan2.1-vae"


class WanDecoder:
    """Streams ``AutoencoderKLWan`` decoding; output equals ``vae.decode(z)`` chunk by chunk."""

    def __init__(
        self, vae: Any, device: torch.device | str = "cpu", tiled: bool = False,
        graphs: int = 0, first_graph: bool = True,
    ) -> None:
        """``graphs``: compiled steady-state chunk graphs kept (CUDA only; 0: always eager);
        ``first_graph``: each size's first chunk gets a graph too (built in the background
        once the steady one exists)."""
        self.device = torch.device(device)
        self.vae = vae.to(self.device)
        self.dtype: torch.dtype = next(self.vae.parameters()).dtype
        self.name = decoder_name(self.vae)
        self.latent_channels = int(self.vae.config.z_dim)
        self.patch_size = self.vae.config.get("patch_size")
        self.tiled = tiled
        self.step = WanStep(self.vae) if supports(self.vae) else None
        self.graphs: ChunkGraphs | None = None
        if self.step is not None and self.device.type == "cuda" and graphs > 0:
            self.graphs = ChunkGraphs.for_vae(self.vae, self.device, capacity=graphs,
                                              first_chunk=first_graph)

    def with_tiling(self) -> WanDecoder:
        """The same model decoding in overlapping spatial tiles (diffusers' tile sizes): the
        smaller working set a job falls back to after a CUDA out-of-memory error."""
        return WanDecoder(self.vae, self.device, tiled=True, graphs=0)

    def output_size(self, latent_h: int, latent_w: int) -> tuple[int, int]:
        scale = SPATIAL_RATIO * (self.patch_size or 1)
        return latent_h * scale, latent_w * scale

    def warmup(self, latent_h: int, latent_w: int, first_now: bool = False) -> None:
        """(CUDA) compile and capture the steady-state graph for this size, then one short
        decode through it, so the first job pays no first-call costs. The first chunk's graph
        is queued as a build (``graphs.wait()``, outside a job, waits for it), or with
        ``first_now`` built here too (the worker's start: ready means both exist).

        Holds the device as a job of its owner (nested in the worker's own warm-up job): the
        short decode must never run beside a build, whose capture it would break."""
        owner = self.graphs.owner if self.graphs is not None else DEVICE
        with owner.job("decoder warm-up"):
            if self.graphs is not None:
                self.graphs.prepare(self.graph_key(latent_h, latent_w), first_now=first_now)
            z = torch.randn((self.latent_channels, 2, latent_h, latent_w))
            for _ in self.stream(z):
                pass

    def graph_key(self, latent_h: int, latent_w: int, batch: int = 1) -> Key:
        return (batch, self.latent_channels, latent_h, latent_w, self.dtype)

    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        if self.tiled:
            return self._stream_tiled(latents)
        return self._stream(latents) if self.step is not None else self._stream_modules(latents)

    @torch.inference_mode()
    def _stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        assert self.step is not None
        z = latents.to(self.device, self.dtype, non_blocking=True).unsqueeze(0)
        graph = None
        if self.graphs is not None:
            key = self.graph_key(z.shape[3], z.shape[4])
            graph = self.graphs.get(key)
            if graph is None and z.shape[2] > 1:
                self.graphs.prepare_later(key)  # this job stays eager; later ones replay
        first = graph.first if graph is not None else None  # read once: built meanwhile
        if graph is not None and first is not None:
            yield first.step(z[:, :, :1])[0]  # its history lands in the steady graph
        else:
            out, caches = self.step(z[:, :, :1])
            yield out[0]
            if graph is not None and z.shape[2] > 1:
                graph.load(caches)
                del caches
        if graph is not None:
            for i in range(1, z.shape[2]):
                yield graph.step(z[:, :, i : i + 1])[0]
            return
        for i in range(1, z.shape[2]):
            out, caches = self.step(z[:, :, i : i + 1], caches)
            yield out[0]

    @torch.inference_mode()
    def _stream_modules(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        """diffusers' own per-frame loop over its modules (the baseline benchmarks compare)."""
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        vae = self.vae
        z = latents.to(self.device, self.dtype, non_blocking=True).unsqueeze(0)
        vae.clear_cache()
        try:
            for i in range(z.shape[2]):
                # post_quant_conv is a 1×1×1 causal conv: per frame equals on the whole clip.
                x = vae.post_quant_conv(z[:, :, i : i + 1])
                vae._conv_idx = [0]
                out = vae.decoder(
                    x, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=(i == 0)
                )
                if self.patch_size is not None:
                    out = unpatchify(out, patch_size=self.patch_size)
                yield out.clamp_(-1.0, 1.0)[0]
        finally:
            # The cache holds activations of the last chunk: free them between jobs.
            vae.clear_cache()

    @torch.inference_mode()
    def _stream_tiled(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        """diffusers' ``tiled_decode``, one latent frame at a time: every tile keeps its own
        causal cache, and each chunk's tiles are blended exactly as ``tiled_decode`` blends
        the whole clip (its blending is spatial only), so the output equals it."""
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        vae = self.vae
        z = latents.to(self.device, self.dtype, non_blocking=True).unsqueeze(0)
        _, _, frames, height, width = z.shape
        r = vae.spatial_compression_ratio
        min_h, min_w = vae.tile_sample_min_height // r, vae.tile_sample_min_width // r
        step_h, step_w = vae.tile_sample_stride_height // r, vae.tile_sample_stride_width // r
        out_h, out_w = vae.tile_sample_stride_height, vae.tile_sample_stride_width
        sample_h, sample_w = height * r, width * r
        p = self.patch_size
        if p is not None:
            sample_h, sample_w, out_h, out_w = sample_h // p, sample_w // p, out_h // p, out_w // p
            blend_h, blend_w = vae.tile_sample_min_height // p - out_h, \
                vae.tile_sample_min_width // p - out_w
        else:
            blend_h = vae.tile_sample_min_height - out_h
            blend_w = vae.tile_sample_min_width - out_w
        vae.clear_cache()
        starts = [(i, j) for i in range(0, height, step_h) for j in range(0, width, step_w)]
        caches: dict[tuple[int, int], list[Any]] = {s: [None] * vae._conv_num for s in starts}
        try:
            for k in range(frames):
                rows: list[list[torch.Tensor]] = []
                for i in range(0, height, step_h):
                    row = []
                    for j in range(0, width, step_w):
                        tile = vae.post_quant_conv(z[:, :, k : k + 1, i : i + min_h, j : j + min_w])
                        row.append(vae.decoder(tile, feat_cache=caches[(i, j)], feat_idx=[0],
                                               first_chunk=(k == 0)))
                    rows.append(row)
                result_rows = []
                for i, row in enumerate(rows):
                    result_row = []
                    for j, tile in enumerate(row):
                        if i > 0:
                            tile = vae.blend_v(rows[i - 1][j], tile, blend_h)
                        if j > 0:
                            tile = vae.blend_h(row[j - 1], tile, blend_w)
                        result_row.append(tile[:, :, :, :out_h, :out_w])
                    result_rows.append(torch.cat(result_row, dim=-1))
                chunk = torch.cat(result_rows, dim=3)[:, :, :, :sample_h, :sample_w]
                if p is not None:
                    chunk = unpatchify(chunk, patch_size=p)
                yield chunk.clamp_(-1.0, 1.0)[0]
        finally:
            caches.clear()
            vae.clear_cache()
