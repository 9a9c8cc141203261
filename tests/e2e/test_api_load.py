"""The API's loopback load check (bench/api/api_load.py) runs and answers every request: 50
concurrent submits and 200 concurrent reads over two gateway replicas, zero errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.require import require_binary
from tests.services import REDIS_INSTALL, REPO_ROOT, WEED_INSTALL

pytestmark = pytest.mark.e2e


def test_two_replicas_answer_every_request(tmp_path: Path) -> None:
    require_binary("redis-server", REDIS_INSTALL)
    require_binary("weed", WEED_INSTALL)
    done = subprocess.run([sys.executable, "bench/api/api_load.py", "--out", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "api-load-cpu.json").read_text())
    assert (result["submits"]["requests"], result["submits"]["errors"]) == (50, 0)
    assert (result["gets"]["requests"], result["gets"]["errors"]) == (200, 0)
    assert result["cross_replica_reads_consistent"] is True
    assert result["gets"]["p50_ms"] <= result["gets"]["p99_ms"]
