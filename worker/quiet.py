"""Dependency noise, silenced where the worker brings the dependencies in.

Importing diffusers pulls in torchao (the fp8 tier) and transformers; on a worker's start they
log lines that say nothing about this worker, and a real problem would be lost among them.
:func:`install` (run when the ``worker`` package is imported, before any of them is) drops
exactly these records, each known by its logger and message, and nothing else those loggers
say. Why each is noise:

- torchao's ``Failed to load …/_C_mxfp8.cpython-310-….so``: a kernel library built for another
  Python than this one (it can never load here), and with torch's CPU build the CUDA kernel
  libraries (``_C_cutlass_…so``). The fp8 tier runs on ``torch._scaled_mm``, not these; with a
  CUDA build a library that fails for another reason is still logged.
- torchao's ``Detected no triton``: torchao's Triton int-matmul kernels; the worker uses none.
- torch's ``<enum …> is an Enum subclass … register_constant() … deprecated``: torchao
  registers its enums the old way at import; torch handles them either way.
- diffusers' ``Unable to import `torchao` Tensor objects``: for loading checkpoints pickled
  with torchao, which the worker never loads (safetensors only).
- transformers' ``CLIPImageProcessor requires torchvision … falling back to
  CLIPImageProcessorPil``: the Pillow processor is the one the worker wants (Wan2.1 I2V).

:func:`progress_bars_off` turns off diffusers' and transformers' loading bars (one log line
per tick in a worker's log); the worker logs one line per model load instead.
"""

from __future__ import annotations

import logging
import re
import sys

_CPYTHON = f"cpython-{sys.version_info.major}{sys.version_info.minor}"


def _foreign_library(message: str) -> bool:
    """torchao's ``Failed to load`` of a library built for another Python, or any of its
    libraries under torch's CPU build."""
    match = re.match(r"Failed to load \S*/torchao/(_C\w*)\.(\S*)so: ", message)
    if match is None:
        return False
    tag = match.group(2)
    if tag.startswith("cpython-") and not tag.startswith(_CPYTHON):
        return True
    import torch  # loaded already: torchao imports it first

    return torch.version.cuda is None  # no CUDA query: this may run before a fork


#: logger name -> whether a message of it is known noise
NOISE = {
    "torchao": _foreign_library,
    "torchao.kernel.intmm": lambda m: m.startswith("Warning: Detected no triton"),
    "torch.utils._pytree": lambda m: "is an Enum subclass and is now natively supported" in m,
    "diffusers.quantizers.torchao.torchao_quantizer":
        lambda m: m.startswith("Unable to import `torchao` Tensor objects"),
    "transformers.utils.import_utils":
        lambda m: "requires torchvision (not installed); falling back to" in m,
}


class _Drop(logging.Filter):
    def __init__(self, known: object) -> None:
        super().__init__()
        self.known = known

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not self.known(record.getMessage())  # type: ignore[operator]
        except Exception:  # noqa: BLE001 - a filter must never break logging
            return True


def install() -> None:
    """Drop the known noise records (idempotent; cheap: no dependency is imported)."""
    for name, known in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(known))


def progress_bars_off() -> None:
    """No tqdm bars from diffusers' and transformers' loading and saving."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


def dtype_kwargs(dtype: object) -> dict[str, object]:
    """``from_pretrained``'s dtype argument under the name this diffusers wants: ``dtype``
    since diffusers renamed it (``torch_dtype`` then warns on every load), else
    ``torch_dtype``. Told by the helper the rename added, not by a version number."""
    from diffusers import utils

    return {"dtype": dtype} if hasattr(utils, "_resolve_dtype") else {"torch_dtype": dtype}
