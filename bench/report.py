"""What every benchmark records beside its figures: the device it ran on and the machine, and
the one way results are written (indented JSON, a folder made if missing).

torch is imported only where a device is named, so the CPU-only benchmarks (queue, API,
images) stay light.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def device_name(device: Any = None) -> str:
    """The GPU's name for a CUDA device (``None``: the current one when CUDA is there), else
    the host's processor (or ``cpu``)."""
    import torch

    kind = getattr(device, "type", device)
    if kind == "cuda" or (kind is None and torch.cuda.is_available()):
        return str(torch.cuda.get_device_name(device))
    return platform.processor() or "cpu"


def device_report(device: Any = None) -> dict[str, Any]:
    """The device and the torch version a GPU or CPU figure was measured with."""
    import torch

    return {"device": device_name(device), "torch": torch.__version__}


def machine() -> dict[str, Any]:
    """The host a CPU benchmark ran on."""
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "processor": platform.processor() or "unknown"}


def write_json(path: str | Path, doc: Any) -> Path:
    """Write ``doc`` as indented JSON (values JSON does not know as their ``str``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str, ensure_ascii=False) + "\n")
    return path
