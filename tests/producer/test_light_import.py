"""The producer must import in an environment without torch, av, boto3 or worker code, and no
producer module imports ``worker`` at all."""

from __future__ import annotations

import subprocess
import sys

from tests.blocked_imports import ROOT, import_blocked


def _import_all(blocked: str, skip: str = "") -> subprocess.CompletedProcess[str]:
    return import_blocked(["producer"], blocked.split(","), walk=True,
                          skip=[p for p in skip.split(",") if p])


def test_producer_imports_without_heavy_packages() -> None:
    # Given an interpreter where importing torch/av/boto3/worker raises ImportError
    # When every producer module but the fleet's operations tools and the HTTP gateway (their
    # own extras) is imported
    out = _import_all("torch,av,boto3,botocore,diffusers,worker,prometheus_client",
                      skip="producer.ops,producer.api")
    # Then they load, and none of the blocked packages was even attempted
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_no_producer_module_imports_worker() -> None:
    # Every module of producer, the operations tools included: never an arrow back up
    out = _import_all("worker,torch,av,diffusers")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_client_and_cli_load_no_worker_module() -> None:
    code = ("import sys, producer.client, producer.cli; "
            "print(sorted(m for m in sys.modules if m == 'worker' or m.startswith('worker.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
