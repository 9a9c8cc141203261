"""Which port a worker serves ``/metrics`` on: the one rule the launcher, compose, the EC2 user
data and the Kubernetes manifests follow.

A worker on GPU index ``i`` (as its container sees it) serves on ``base + i``; CPU worker ``j``
on ``base + CPU_PORT_OFFSET + j``, clear of the GPU range; ``base`` 0 turns metrics off.
``base`` is ``FRAMEFLEET_METRICS_PORT``. A container given one GPU sees it as index 0, so it
serves on its own ``base``: compose and the user data give container N the base ``9400 + N``,
a Kubernetes pod (one GPU, its own IP) keeps ``9400``.
"""

from __future__ import annotations

#: CPU workers start this far above the base (a host has at most a few dozen GPUs).
CPU_PORT_OFFSET = 100


def metrics_port_for(base: int, *, gpu: int | None = None, cpu: int | None = None) -> int:
    """The ``/metrics`` port of the worker on GPU ``gpu`` or CPU slot ``cpu`` (0: off)."""
    if (gpu is None) == (cpu is None):
        raise ValueError("metrics_port_for: give exactly one of gpu= or cpu=")
    index = gpu if gpu is not None else cpu
    assert index is not None
    if index < 0:
        raise ValueError(f"metrics_port_for: index must be >= 0, got {index}")
    if base == 0:
        return 0
    return base + index if gpu is not None else base + CPU_PORT_OFFSET + index
