"""Which port a worker serves ``/metrics`` on, and the fleet exporter's: the one rule the
launcher, compose, the Prometheus configuration, the EC2 user data and the Kubernetes manifests
follow (``tests/infra`` derives every port they name from this module).

A worker on GPU index ``i`` (as its container sees it) serves on ``base + i``; CPU worker ``j``
on ``base + CPU_PORT_OFFSET + j``, clear of the GPU range; ``base`` 0 turns metrics off.
``base`` is ``FRAMEFLEET_METRICS_PORT``. A container given one GPU sees it as index 0, so it
serves on its own ``base``: compose and the user data give container N the base ``9400 + N``,
a Kubernetes pod (one GPU, its own IP) keeps ``9400``. The fleet exporter (one per fleet)
serves on ``FRAMEFLEET_EXPORTER_PORT``, just above the range of an 8-GPU host.
"""

from __future__ import annotations

#: Default ``FRAMEFLEET_METRICS_PORT``: the base of the worker ports.
DEFAULT_METRICS_PORT = 9400
#: Default ``FRAMEFLEET_EXPORTER_PORT``: ``framefleet exporter``'s ``/metrics``.
DEFAULT_EXPORTER_PORT = 9410
#: Default ``FRAMEFLEET_API_PORT``: ``framefleet api``, the HTTP gateway.
DEFAULT_API_PORT = 8000

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
