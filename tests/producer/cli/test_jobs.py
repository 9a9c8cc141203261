"""``framefleet jobs list`` piped (issue 54, point 5): no cell folded or cut, whatever the
width a terminal would have."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from producer.state.ledger import record_name
from producer.wire.results import LedgerRecord, StateTime
from tests.services import REPO_ROOT

KEY = "acme-media-eu-west:clip-2026-12-06-a-rather-long-job-name-0042"


def _failed(key: str, finished_at: float) -> LedgerRecord:
    tenant, job_id = key.split(":")
    return LedgerRecord(
        key=key, job_id=job_id, tenant=tenant, spec_digest="0" * 64, status="failure",
        reason="InvalidJobError", error="input.uri: no such object", node="cpu0@worker-host-1",
        states=(StateTime(state="STARTED", at=finished_at - 1),),
        output_uri=f"s3://videos/out/{tenant}/{job_id}", finished_at=finished_at)


def test_a_piped_list_folds_and_cuts_nothing(tmp_path: Path) -> None:
    record = _failed(KEY, time.time() - 60)
    path = tmp_path / "ledger" / record_name(record, "0badcafe")
    path.parent.mkdir(parents=True)
    path.write_text(record.model_dump_json() + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    # COLUMNS as a terminal of 80 would set it; stdout is a pipe
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "jobs", "list", "--ledger",
         (tmp_path / "ledger").as_uri()], cwd=REPO_ROOT, capture_output=True, text=True,
        env={**env, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "80"}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if KEY in line]
    # Was: the reason cut to "InvalidJobErro" and the rest folded onto the next lines
    assert len(rows) == 1, done.stdout
    assert rows[0].split()[2:8] == [KEY, "failure", "cpu0@worker-host-1", "0.00", "0.0000",
                                    "InvalidJobError"], rows[0]
    assert "…" not in done.stdout
