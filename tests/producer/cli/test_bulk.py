"""``framefleet submit --from FILE`` (issue 54, point 13): a JobSpec per line, each queued with
every guarantee of a single submit; the keys of the queued on stdout, a line per line refused
on stderr, and an exit status that says whether any was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis
from typer.testing import CliRunner

from producer.cli.app import cli
from producer.ops.exporter import queue_depth
from producer.state import keys
from tests.services import REPO_ROOT, free_port

runner = CliRunner()


def _line(job_id: str, **changes: Any) -> str:
    return json.dumps({"job_id": job_id, "tenant": "acme", "input": {"uri": "s3://b/z.npy"},
                       "decoder": {"name": "pattern"}, "output": {"uri": "s3://b/out"},
                       **changes})


def test_a_file_of_specs_queues_each_and_reports_each_refusal(env: str, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    good = [_line(f"clip-{i}") for i in range(250)]
    jobs.write_text("\n".join([
        *good[:100], "",  # a blank line is skipped
        "{not json", *good[100:200],
        _line("clip-7", priority=1),  # a job_id of the file reused with another spec
        _line("clip-x", video={"crf": 99}),  # a spec the wire refuses
        _line("clip-w", decoder={"name": "wan2.1-vae"}),  # one the fleet's rules refuse
        *good[200:], _line("clip-3"),  # the same job twice: one job
    ]) + "\n")
    out = runner.invoke(cli, ["submit", "--from", str(jobs)])
    assert out.exit_code == 1, out.output
    # stdout: the key of each job queued (or found), in the file's order
    assert out.stdout.split() == [f"acme:clip-{i}" for i in range(250)] + ["acme:clip-3"]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 4, out.stderr
    assert errors[0].startswith("error: line 102: invalid job spec: ")
    assert errors[1].startswith("error: line 203: acme:clip-7: job_id 'clip-7' of tenant "
                                "'acme' was already submitted with a different spec: "
                                "priority: 5 -> 1")
    assert errors[2].startswith("error: line 204: invalid job spec: video.crf: ")
    assert errors[3].startswith("error: line 205: acme:clip-w: decoder.weights: ")
    assert out.stderr.splitlines()[-1].startswith(
        f"note: queued 251 of 255 jobs from {jobs} on the broker at ")
    r = redis.Redis.from_url(env)
    assert queue_depth(env) == 250 and r.zcard(keys.QUEUED) == 250
    # The same file again: every job is the one there (nothing queued twice)
    again = runner.invoke(cli, ["submit", "--from", str(jobs)])
    assert again.exit_code == 1 and again.stdout == out.stdout
    assert queue_depth(env) == 250


def test_a_file_of_good_specs_exits_0(env: str, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(_line(f"ok-{i}") for i in range(3)) + "\n")
    out = runner.invoke(cli, ["submit", "--from", str(jobs)])
    assert out.exit_code == 0 and out.stdout.split() == ["acme:ok-0", "acme:ok-1", "acme:ok-2"]
    assert "error" not in out.stderr


def test_from_is_refused_in_one_line_when_it_cannot_be(env: str, tmp_path: Path) -> None:
    missing = runner.invoke(cli, ["submit", "--from", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 1
    assert missing.stderr.startswith(f"error: --from: cannot read {tmp_path / 'none.jsonl'}")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    out = runner.invoke(cli, ["submit", "--from", str(empty)])
    assert out.exit_code == 1 and "holds no JobSpec" in out.stderr
    both = runner.invoke(cli, ["submit", "--from", str(empty), "--wait"])
    assert both.exit_code == 1 and "--from: a file of JobSpecs, alone" in both.stderr


def test_a_broker_that_does_not_answer_is_one_line_and_69(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(_line(f"down-{i}") for i in range(3)) + "\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "submit", "--from", str(jobs)], cwd=REPO_ROOT,
        env={**base, "PYTHONPATH": str(REPO_ROOT),
             "FRAMEFLEET_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"},
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 69, done.stderr
    assert done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "connection refused" in errors[0]
    assert errors[0].endswith("line 1 and every line after it were not queued"), errors[0]
