"""Precision tiers of a resident transformer: ``exact`` (compiled regionally) and ``fp8``.

- **exact**: the model's own diffusers modules in the job's dtype. On CUDA each repeated block
  (the classes diffusers lists in the model's ``_repeated_blocks``, as its
  ``compile_repeated_blocks`` does) is compiled with ``fullgraph=True``; on the CPU it runs
  eager. Compiling changes kernels, not arithmetic: one forward stays within 2e-2 relative L2
  of eager (``tests/gpu/test_gpu_tiers.py``, ``bench/generate.py``'s quality column).
- **fp8**: torchao's ``Float8DynamicActivationFloat8WeightConfig(PerRow())`` on the
  transformer's linear layers (norms stay bfloat16), and the blocks' self-attention in 8 bits
  where this GPU has a kernel for it (``attn8``, chosen by ``attnchoice``), then compiled the
  same way.
  Only a GPU of compute capability 8.9 or more has float8 matrix units: anywhere else the job
  fails at once, naming ``generate.tier``. There is no fallback to another tier.

  The activation scale has a floor (``FP8_ACTIVATION_LB``). torchao scales each row by its
  largest magnitude, ``amax / 448``, and divides the row by that scale; a row of zeros gets the
  scale 0 and becomes 0 / 0 = NaN. ``WanPipeline`` pads every prompt's embeddings to 512 tokens
  with zero rows, so the text projection's first linear layer saw such rows in every job: its
  NaN rows reached every video token through cross-attention, and the whole video was NaN
  (random prompt embeddings, with no zero rows, were finite; on the H200 the same 5B forward
  went from 100 % NaN to finite with those rows at 1e-3). With the floor a zero row's scale is
  ``1e-12 / 448`` and it quantises to zeros; any real row's ``amax`` is far above the floor,
  so its scale is unchanged. A linear layer whose weight has a row of zeros stays bfloat16:
  torchao's weight scales have no floor.

Why the blocks' ``forward`` is compiled rather than their ``_call_impl`` (what
``ModelMixin.compile_repeated_blocks`` does): diffusers' step caches hook a block by replacing
its ``forward``. A compiled ``_call_impl`` would trace into the hook (graph breaks, which
``fullgraph`` refuses, and a recompile whenever a cache is switched on or off); a compiled
``forward`` is what the hook wraps and calls, so the same compiled code runs with or without a
cache, and switching caches recompiles nothing.

The number of compiled sizes is bounded (``FRAMEFLEET_COMPILED_SIZES``): a job of a size beyond
the bound runs eager (``eager_blocks``: its blocks' own forwards) instead of recompiling.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from producer.errors import InvalidJobError
from worker.generate.tier import attnchoice, attnproc

log = logging.getLogger(__name__)
#: Float8 matrix units: Ada (8.9) and Hopper (9.0) onwards.
FP8_MIN_CAPABILITY = (8, 9)
#: Floor of a row's largest magnitude when its float8 scale is computed (see the docstring).
FP8_ACTIVATION_LB = 1e-12


def check_tier(tier: str, device: torch.device) -> None:
    """Refuse (``InvalidJobError`` naming ``generate.tier``) a tier this worker cannot run."""
    if tier != "fp8":
        return
    if device.type != "cuda":
        raise InvalidJobError(
            "generate.tier: fp8 needs a GPU with float8 matrix units (compute capability "
            f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or more); this worker runs on "
            "the CPU. Ask for tier exact, or send the job to a GPU fleet")
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        raise InvalidJobError(
            f"generate.tier: fp8 needs compute capability 8.9 or more; this GPU "
            f"({torch.cuda.get_device_name(device)}) has {capability[0]}.{capability[1]}")
    try:
        import torchao  # noqa: F401
    except ImportError as e:
        raise InvalidJobError(f"generate.tier: fp8 needs torchao on this worker: {e}") from e


def transformers_of(pipe: Any) -> list[Any]:
    """The pipeline's denoisers: ``transformer`` and, for two experts, ``transformer_2``."""
    return [m for m in (pipe.transformer, getattr(pipe, "transformer_2", None)) if m is not None]


#: Inductor options the fp8 tier's blocks compile with: what torchao's
#: ``recommended_inductor_config_setter`` sets, given to those compiles only (``fp8_config``).
FP8_INDUCTOR = {"coordinate_descent_tuning": True,
                "coordinate_descent_check_all_directions": True}


def fp8_config() -> Any:
    """The fp8 tier's torchao config: per-row float8 activations and weights, the activation
    scale floored at ``FP8_ACTIVATION_LB`` (see the module's docstring).

    ``set_inductor_config=False``: by default torchao's float8 transform sets inductor's
    config process-wide (coordinate-descent tuning in every direction, and more). Every
    later compile of the process then ran with it: the exact tier's blocks compiled 5-10x
    slower and under other FX graph cache keys, so a worker that quantised an fp8 copy first
    missed the exact tier's cache and artifacts (the GPU soak: 63-105 s a size against 7-12 s).
    The fp8 blocks get those options in their own ``torch.compile`` (``FP8_INDUCTOR``)."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

    return Float8DynamicActivationFloat8WeightConfig(
        granularity=PerRow(), activation_value_lb=FP8_ACTIVATION_LB, set_inductor_config=False)


def fp8_linear(module: torch.nn.Module, fqn: str = "") -> bool:
    """Whether the fp8 tier quantises ``module``: a bf16 linear layer with no all-zero weight
    row (a weight scale of 0 would make that row NaN)."""
    if not isinstance(module, torch.nn.Linear) or module.weight.dtype != torch.bfloat16:
        return False
    with torch.no_grad():
        zero_row = bool((module.weight.abs().amax(dim=1) == 0).any())
    if zero_row:
        log.info("fp8: %s has a weight row of zeros; it stays bfloat16", fqn or module)
    return not zero_row


def quantise_fp8(transformer: Any) -> None:
    """torchao float8 dynamic activation + weight, per-row scales, on every bf16 linear layer.

    The layers diffusers keeps in float32 (``_keep_in_fp32_modules``: the time and condition
    embedders) stay as they are: per-row float8 takes bf16 weights only, and they are kept
    precise on purpose."""
    from torchao.quantization import quantize_

    quantize_(transformer, fp8_config(), filter_fn=fp8_linear)


def compile_blocks(transformer: Any, options: dict[str, Any] | None = None,
                   backend: Any = "inductor") -> int:
    """Compile the ``forward`` of every repeated block (see the module's docstring), with
    these inductor ``options`` (this compile's only, never the process's); returns how many.
    Raises ``ValueError`` when the model names no repeated blocks. ``backend``: a test's
    capturing backend (the worker's is inductor)."""
    names = set(getattr(transformer, "_repeated_blocks", None) or ())
    count = 0
    for module in transformer.modules():
        if type(module).__name__ in names:
            compiled = torch.compile(module.forward, fullgraph=True, dynamic=False,
                                     options=dict(options) if options else None,
                                     backend=backend)
            module._framefleet_forwards = (module.forward, compiled)  # eager, compiled
            module.forward = compiled
            count += 1
    if not count:
        raise ValueError(f"{type(transformer).__name__} names no repeated blocks to compile")
    return count


def allow_recompiles(sizes: int, tiers: int = 2) -> None:
    """Let dynamo keep a graph per compiled size and tier (its default limit is 8 per code
    object; every block class shares one)."""
    import torch._dynamo

    needed = 2 * sizes * tiers + 8  # two entries a size were seen on the first blocks
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < needed:
        setattr(config, name, needed)


def prepare(pipe: Any, tier: str, compile: bool) -> bool:
    """Make ``pipe``'s transformers the ``tier`` (quantised for fp8) and compile their blocks
    when ``compile`` (CUDA). Returns whether they are compiled.

    On CUDA the self-attention's kernel is this GPU's choice (``attnchoice``): the fastest
    exact one, and for fp8 the 8-bit attention where one runs here."""
    for transformer in transformers_of(pipe):
        if tier == "fp8":
            quantise_fp8(transformer)
        device = next(transformer.parameters()).device
        if device.type == "cuda":
            attnproc.install(transformer, attnchoice.ensure(device, transformer), tier == "fp8")
        if compile:
            compile_blocks(transformer, FP8_INDUCTOR if tier == "fp8" else None)
    return compile


@contextmanager
def eager_blocks(*transformers: Any) -> Iterator[None]:
    """Run these transformers' compiled blocks eagerly inside the block, for these models only.

    Not ``torch.compiler.set_stance("force_eager")``: the stance is process-wide, so a decoder
    graph warming up on another thread meanwhile would skip its compile and then compile inside
    its CUDA graph capture, where autotuning's synchronize fails (seen on the H200)."""
    blocks = [m for t in transformers for m in t.modules() if hasattr(m, "_framefleet_forwards")]
    for block in blocks:
        block.forward = block._framefleet_forwards[0]
    try:
        yield
    finally:
        for block in blocks:
            block.forward = block._framefleet_forwards[1]


@contextmanager
def size_stance(sizes: list[Any], compiled: bool, key: Any, limit: int,
                eager: bool = False, transformers: tuple[Any, ...] = ()) -> Iterator[bool]:
    """Run one job's denoise compiled if its size ``key`` is compiled already or the bound
    ``limit`` leaves room (it is then compiled on first use); else, or with ``eager`` (a job
    with adapters inside the blocks), eager. Yields whether it runs compiled."""
    if compiled and not eager and (key in sizes or len(sizes) < limit):
        if key not in sizes:
            sizes.append(key)
        yield True
        return
    if compiled:
        log.info("transformer runs eager for size %s (%s)", key,
                 "adapters inside its blocks" if eager
                 else f"{len(sizes)} sizes compiled already: FRAMEFLEET_COMPILED_SIZES")
        with eager_blocks(*transformers):
            yield False
        return
    yield False
