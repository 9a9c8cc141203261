"""Which device decodes (FRAMEFLEET_DEVICE) and what a result says about the worker.

Without a GPU here, CUDA's presence is played by patching ``torch.cuda``'s queries; the test
marked ``gpu`` checks the same against a real device.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types

import pytest
import torch

from producer.errors import FatalJobError
from tests.services import REPO_ROOT
from worker.devices import resolve_device, worker_info


def _pretend_cuda(monkeypatch: pytest.MonkeyPatch, *, uuid: object = "GPU-1234") -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")

    def properties(device: torch.device) -> object:
        if isinstance(uuid, Exception):
            raise uuid
        return types.SimpleNamespace(uuid=uuid)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)


def test_cpu_is_cpu_even_with_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_cuda(monkeypatch)
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_and_cuda_take_the_one_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_cuda(monkeypatch)
    # CUDA_VISIBLE_DEVICES pins one GPU per worker: inside the process it is always cuda:0.
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)


def test_without_a_gpu_auto_falls_back_and_cuda_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(FatalJobError, match="FRAMEFLEET_DEVICE=cuda but no CUDA device"):
        resolve_device("cuda")


def test_worker_info_on_the_cpu_names_host_and_process() -> None:
    info = worker_info(torch.device("cpu"))
    host = socket.gethostname()
    assert (info.hostname, info.pid, info.device) == (host, os.getpid(), "cpu")
    assert info.node == f"{os.getpid()}@{host}"  # no Celery node name: the process stands in
    assert info.gpu_name is None and info.gpu_uuid is None
    assert worker_info(torch.device("cpu"), node="gpu3@h").node == "gpu3@h"


def test_worker_info_on_a_gpu_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_cuda(monkeypatch, uuid="GPU-8f0e")
    info = worker_info(torch.device("cuda", 0), node="gpu0@h")
    assert (info.device, info.gpu_name, info.gpu_uuid) == ("cuda:0", "NVIDIA H200", "GPU-8f0e")


@pytest.mark.parametrize("error", [AttributeError("no uuid"), RuntimeError("driver says no")])
def test_worker_info_without_a_readable_uuid_still_reports(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # Old torch builds have no ``uuid`` property; a failing query must not fail the job.
    _pretend_cuda(monkeypatch, uuid=error)
    info = worker_info(torch.device("cuda", 0))
    assert info.gpu_name == "NVIDIA H200" and info.gpu_uuid is None


@pytest.mark.gpu
def test_real_gpu_is_resolved_and_named() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    device = resolve_device("auto")
    info = worker_info(device)
    assert device == torch.device("cuda", 0)
    assert info.gpu_name == torch.cuda.get_device_name(0)
    assert info.gpu_uuid is not None and len(info.gpu_uuid) >= 32


@pytest.mark.gpu
def test_import_does_not_initialise_cuda() -> None:
    # A fork after CUDA is initialised breaks the child: importing must not initialise it.
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: CUDA cannot be initialised here at all")
    code = (
        "import torch, worker.devices\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised at import'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
