"""The decoders and generation models a worker process keeps, built once and reused."""

from __future__ import annotations

from collections import OrderedDict

import torch

from producer.settings import Settings, get_settings
from producer.wire.spec import DecoderSpec
from worker.decoders.base import ChunkDecoder
from worker.devices import resolve_device
from worker.generate import ModelCache
from worker.inputs.weights import resolve_weights
from worker.memory import track


class DecoderCache:
    """Decoders built once per worker process and reused (weights loaded, warmed up)."""

    def __init__(
        self, device: torch.device, capacity: int = 2, graphs: int = 0,
        models: ModelCache | None = None, settings: Settings | None = None,
    ) -> None:
        """``graphs``: compiled decode graphs each Wan decoder keeps (see decoders/wan_graph).
        ``models``: the generation pipelines resident beside the decoders (worker/generate).
        ``settings``: where weights folders may lie (FRAMEFLEET_FILE_ROOTS); default: the
        process's settings."""
        self.settings = settings
        self.device = device
        self.capacity = capacity
        self.graphs = graphs
        self._cache: OrderedDict[tuple[object, ...], ChunkDecoder] = OrderedDict()
        self.models = models or ModelCache(device, 2**40, graphs=graphs)

    def get(self, spec: DecoderSpec) -> ChunkDecoder:
        key = (spec.name, spec.weights, spec.preset, spec.dtype, spec.seed)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        decoder = self._build(spec)
        self._cache[key] = decoder
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return decoder

    def _build(self, spec: DecoderSpec) -> ChunkDecoder:
        # The weights are resolved here, where the decoder is chosen: a job that names none,
        # or a folder that is not there, fails before any model is built.
        weights = resolve_weights(spec, self.settings or get_settings())
        if spec.name == "pattern":
            from worker.decoders.pattern import PatternDecoder

            return PatternDecoder(self.device)
        from worker.decoders.wan import DTYPES, WanDecoder, build_vae

        name = spec.dtype
        if name == "auto":
            name = "bfloat16" if self.device.type == "cuda" else "float32"
        vae = build_vae(spec.preset, weights, spec.seed, DTYPES[name], device=self.device)
        return WanDecoder(vae, self.device, graphs=self.graphs)


def default_decoders(settings: Settings | None = None) -> DecoderCache:
    """The process's cache, sized and placed by ``settings`` (default: the environment's)."""
    settings = settings or get_settings()
    device = resolve_device(settings.device)
    models = ModelCache(device, int(settings.model_cache_gib * 2**30),
                        settings.text_encoder_offload, graphs=settings.decode_graphs,
                        compiled_sizes=settings.compiled_sizes,
                        load_method=settings.load_method, load_threads=settings.load_threads,
                        compile_cpu=settings.compile_on_cpu)
    track(models)  # the memory guard may evict its residents after a job it stopped
    return DecoderCache(device, graphs=settings.decode_graphs, models=models, settings=settings)
