"""The ``framefleet`` command line as a new user meets it: help, version, one-line errors.

In-process through typer's CliRunner against a real Redis, and as a real subprocess where the
environment or the exit status is the point (Redis down, a bad FRAMEFLEET_* value).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import redis
from typer.main import get_command
from typer.testing import CliRunner

from producer.app import QUEUE
from producer.cli.app import EXIT_TIMEOUT, _uri, cli
from producer.cli.output import EXIT_UNAVAILABLE
from tests.services import REPO_ROOT, free_port
from tests.terminal import ctrl_c_as_from_a_terminal

runner = CliRunner()


def _framefleet(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m producer.cli ARGS`` in a clean environment plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO_ROOT,
                          env={**base, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "80", **env},
                          capture_output=True, text=True, timeout=60)


def _one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


def _all_commands(group: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(group, click.Group) or hasattr(group, "commands"):
        for name, sub in sorted(getattr(group, "commands", {}).items()):
            yield from _all_commands(sub, (*path, name))


def test_version() -> None:
    result = runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("framefleet ")


def test_help_has_no_type_tags_braces_or_rst() -> None:
    paths = list(_all_commands(get_command(cli)))
    assert ("wait",) in paths and ("cost", "report") in paths
    for path in paths:
        result = runner.invoke(cli, [*path, "--help"], terminal_width=100)
        assert result.exit_code == 0, (path, result.output)
        for bad in ("<bool>", "<str>", "<int>", "<float>", "<path>", "{", "``"):
            assert bad not in result.output, (path, bad, result.output)
    wait = runner.invoke(cli, ["wait", "--help"], terminal_width=100).output
    assert "--json" in wait and "--timeout" in wait and "3600" in wait and "124" in wait
    assert "JOB_ID" in runner.invoke(cli, ["status", "--help"]).output


def test_submit_with_a_missing_spec_file_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(cli, ["submit", "--spec", str(tmp_path / "job.json")])
    assert result.exit_code == 1
    line = _one_error_line(result.output)
    assert "--spec" in line and "job.json" in line and "No such file" in line


def test_submit_without_weights_names_the_flag(env: str, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["submit", "--input", str(tmp_path / "z.npy"),
                                 "--output", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "error: --weights: the wan2.1-vae decoder needs weights" in _one_error_line(
        result.output)


@pytest.mark.parametrize(("args", "said", "unsaid"), [
    # issue 54, point 4: was "generate.num_inference_steps: Input should be greater …"
    (["--steps", "-5"], "error: invalid job spec: --steps: Input should be greater than or "
     "equal to 1", "num_inference_steps"),
    (["--frames", "8", "--steps", "0"], "error: invalid job spec: --frames: must be 4k+1 "
     "(1, 5, 9, … 81), got 8; --steps: ", "generate."),
    (["--crf", "99", "--priority", "12"], "--crf: Input should be less than or equal to 51; "
     "--priority: Input should be less than or equal to 9", "video.crf"),
    (["--lora", "style.safetensors:x2"], "error: --lora: expected FILE:SCALE", "loras"),
], ids=["steps", "frames-and-steps", "crf-and-priority", "lora"])
def test_an_option_refused_is_named_by_its_flag(env: str, tmp_path: Path, args: list[str],
                                               said: str, unsaid: str) -> None:
    prompt = ["submit", "--prompt", "a fox", "--model", str(tmp_path / "m"), "--output",
              str(tmp_path / "out"), "--job-id", "flags-1"]
    result = runner.invoke(cli, [*prompt, *args])
    assert result.exit_code == 1, result.output
    line = _one_error_line(result.output)
    assert said in line and unsaid not in line, line
    assert not redis.Redis.from_url(env).exists("framefleet:spec:flags-1")  # nothing claimed


def test_a_spec_file_is_refused_in_its_own_field_names(env: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"job_id": "file-1", "input": {"uri": "s3://b/z.npy"},
                                "output": {"uri": "s3://b/out"}, "video": {"crf": 99}}))
    line = _one_error_line(runner.invoke(cli, ["submit", "--spec", str(spec)]).output)
    # The file spells the fields: the error names them as it does (and the API's do too)
    assert "video.crf: Input should be less than or equal to 51" in line and "--" not in line


def test_plain_paths_become_file_uris(env: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _uri("z.npy") == (tmp_path / "z.npy").as_uri()
    assert _uri("s3://b/k") == "s3://b/k" and _uri("random") == "random"
    result = runner.invoke(cli, ["submit", "--input", "z.npy", "--output", "out",
                                 "--weights", "models/vae", "--job-id", "plain-1"])
    assert result.exit_code == 0, result.output
    digest = redis.Redis.from_url(env).get("framefleet:spec:plain-1")
    assert digest is not None  # submitted: the spec took the paths as file:// URIs


def _queued_spec(broker: str) -> dict[str, Any]:
    """The JobSpec of the one message waiting in the broker's queue lists."""
    r = redis.Redis.from_url(broker)
    lists = [k for k in r.keys(f"{QUEUE}*") if r.type(k) == b"list"]
    assert len(lists) == 1 and r.llen(lists[0]) == 1
    body = json.loads(base64.b64decode(json.loads(r.lindex(lists[0], 0))["body"]))
    spec: dict[str, Any] = body[0][0]
    return spec


@pytest.mark.parametrize(("decoder", "given", "fps"),
                         [("wan2.2-vae", None, 24.0), ("wan2.1-vae", None, 16.0),
                          ("wan2.2-vae", "30", 30.0)])
def test_submit_frame_rate_defaults_to_the_decoders_model(
        env: str, decoder: str, given: str | None, fps: float) -> None:
    args = ["submit", "--input", "/z.npy", "--output", "/o", "--decoder", decoder,
            "--weights", "random", "--job-id", "fps-cli"]
    result = runner.invoke(cli, args + (["--fps", given] if given else []))
    assert result.exit_code == 0, result.output
    assert _queued_spec(env)["video"]["fps"] == fps


def _where(url: str) -> str:
    """host:port of a test Redis URL (redis://127.0.0.1:PORT/0)."""
    return url.split("://", 1)[1].split("@")[-1].split("/")[0]


def test_status_cancel_wait_of_an_unknown_id(env: str) -> None:
    # Each answer names the broker it asked: a new terminal without FRAMEFLEET_BROKER_URL
    # asks 127.0.0.1:6379, and "unknown" alone would not say so
    where = _where(env)
    status = runner.invoke(cli, ["status", "never-cli"])
    assert status.exit_code == 1
    assert f"never-cli: UNKNOWN (no such job on {where}: never submitted" in status.output
    cancel = runner.invoke(cli, ["cancel", "never-cli"])
    assert cancel.exit_code == 1
    assert f"never-cli: no such job on {where}" in _one_error_line(cancel.output)
    assert not redis.Redis.from_url(env).exists("framefleet:cancel:never-cli")
    t0 = time.monotonic()
    wait = runner.invoke(cli, ["wait", "never-cli", "--json"])
    assert wait.exit_code == 1 and f"no such job on {where}" in _one_error_line(wait.output)
    assert time.monotonic() - t0 < 10  # the 5 s grace, not the 3600 s timeout


def test_a_terminal_without_the_broker_url_is_told_which_it_asked() -> None:
    # Given a new terminal: no FRAMEFLEET_BROKER_URL, and a Redis of its own on 6379 or none
    out = _framefleet("status", "from-elsewhere")
    # Then the answer names the default broker, whatever it says of the job
    assert "127.0.0.1:6379" in out.stdout + out.stderr, out.stdout + out.stderr
    # and a password never shows
    out = _framefleet("status", "from-elsewhere",
                      FRAMEFLEET_BROKER_URL=f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    assert "hunter2" not in out.stdout + out.stderr


def test_status_of_a_queued_job_and_wait_timing_out(env: str, tmp_path: Path) -> None:
    submit = runner.invoke(cli, ["submit", "--input", (tmp_path / "z.npy").as_uri(),
                                 "--output", (tmp_path / "o").as_uri(), "--decoder", "pattern",
                                 "--job-id", "queued-cli"])
    where = _where(env)
    assert submit.exit_code == 0 and submit.stdout.strip() == "queued-cli"
    assert f"note: queued on the broker at {where}" in submit.stderr
    # No FRAMEFLEET_FILE_ROOTS here: the CLI says that the workers decide on local paths
    assert "warning: --input, --output: local paths on the workers" in submit.stderr
    assert runner.invoke(cli, ["status", "queued-cli"]).stdout.strip() == (
        f"queued-cli: QUEUED, broker {where}")
    wait = runner.invoke(cli, ["wait", "queued-cli", "--timeout", "0.5", "--json"])
    assert wait.exit_code == EXIT_TIMEOUT
    assert f"still QUEUED after 0.5 s (broker {where})" in _one_error_line(wait.output)
    cancel = runner.invoke(cli, ["cancel", "queued-cli"])
    assert cancel.exit_code == 0
    assert f"cancel requested for queued-cli (was QUEUED) on {where}" in cancel.output


@pytest.mark.parametrize("args", [["status", "j1"], ["wait", "j1"], ["cancel", "j1"],
                                  ["submit", "--input", "/z.npy", "--output", "/o",
                                   "--decoder", "pattern"], ["healthcheck"]],
                         ids=["status", "wait", "cancel", "submit", "healthcheck"])
def test_redis_down_is_one_line_naming_the_url_masked(args: list[str]) -> None:
    port = free_port()
    t0 = time.monotonic()
    out = _framefleet(*args, FRAMEFLEET_BROKER_URL=f"redis://:hunter2@127.0.0.1:{port}/0")
    took = time.monotonic() - t0
    assert out.returncode == EXIT_UNAVAILABLE, out.stdout + out.stderr
    line = _one_error_line(out.stderr)
    assert f"redis://:**@127.0.0.1:{port}/0" in line and "connection refused" in line
    assert "hunter2" not in out.stderr + out.stdout and "Traceback" not in out.stderr
    assert took < 10, f"{args[0]} took {took:.1f} s (interpreter start included)"


def test_a_bad_environment_value_names_the_variable() -> None:
    out = _framefleet("status", "j1", FRAMEFLEET_RETRY_MAX="50")
    assert out.returncode == 1
    line = _one_error_line(out.stderr)
    assert "FRAMEFLEET_RETRY_MAX='50'" in line and "less than or equal to 20" in line
    assert "retry_max" not in line


def test_errors_keep_brackets_and_stay_on_one_line(env: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text('{"job_id": "[x]", "input": {"uri": "s3://b/z.npy"}}')
    result: Any = runner.invoke(cli, ["submit", "--spec", str(spec)], terminal_width=40)
    line = _one_error_line(result.output)
    assert "job_id" in line and "output" in line  # every bad field, on the one line
    assert "[A-Za-z0-9._-]{1,128}" in line  # not eaten as markup


@pytest.mark.parametrize(("args", "message"), [
    (["worker", "--gpus", "foo"],
     "error: --gpus: 'foo' is not 'all', a count such as 2, or GPU indices such as 0,2"),
    (["demo", "--frames", "10"],
     "error: --frames: 10 is not 4k+1 (the decoder makes 1 frame from the first latent frame "
     "and 4 from each next one): use 9 or 13"),
    (["demo", "--frames", "0"], "error: --frames: 0 is not 4k+1"),
], ids=["gpus", "frames", "no-frames"])
def test_a_bad_count_is_one_line_before_anything_starts(args: list[str], message: str) -> None:
    out = _framefleet(*args)
    assert out.returncode == 1
    assert _one_error_line(out.stderr).startswith(message), out.stderr
    assert out.stdout == ""  # no demo started, no worker launched


_STUCK = """
import time
from producer.cli.output import ctrl_c_exits
with ctrl_c_exits("interrupted: the job goes on"):
    ready = False
    while True:
        try:
            if not ready:
                ready = True
                print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            pass  # a library that swallows Ctrl-C: the command never gets to its own exit
"""


def test_ctrl_c_ends_a_command_whose_main_thread_never_sees_it() -> None:
    from producer.cli.output import CTRL_C_GRACE_S, EXIT_INTERRUPTED

    proc = subprocess.Popen([sys.executable, "-c", _STUCK], cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                            preexec_fn=ctrl_c_as_from_a_terminal)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        t0 = time.monotonic()
        proc.send_signal(2)  # SIGINT
        _, err = proc.communicate(timeout=CTRL_C_GRACE_S + 20)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED
    assert err == "error: interrupted: the job goes on\n"
    assert CTRL_C_GRACE_S <= time.monotonic() - t0 < CTRL_C_GRACE_S + 20


@pytest.mark.parametrize(("given", "every"), [("3", 3), ("off", 0), (None, None)])
def test_submit_preview_option(env: str, given: str | None, every: int | None) -> None:
    args = ["submit", "--prompt", "a fox", "--model", "/models/tiny", "--size", "64x64",
            "--frames", "9", "--steps", "4", "--output", "/o", "--job-id", "pv-cli"]
    result = runner.invoke(cli, args + (["--preview", given] if given else []))
    assert result.exit_code == 0, result.output
    preview = _queued_spec(env)["generate"].get("preview")
    # left out: the worker's default (every 2), and the spec's digest as it always was
    assert (preview["every"] if preview else None) == every


def test_submit_preview_option_refused_naming_it(env: str) -> None:
    args = ["submit", "--prompt", "a fox", "--model", "/models/tiny", "--output", "/o"]
    for bad in ("x", "-1"):
        result = runner.invoke(cli, [*args, "--preview", bad])
        assert result.exit_code == 1 and "--preview: expected a number of steps" in \
            _one_error_line(result.output), result.output


def test_wait_on_a_job_that_already_failed_draws_no_bar(env: str) -> None:
    # Given a job that failed before anyone waits for it (its FAILURE stored as a worker
    # stores it)
    submit = runner.invoke(cli, ["submit", "--input", "s3://b/z.npy", "--output", "s3://b/o",
                                 "--decoder", "pattern", "--job-id", "failed-cli"])
    assert submit.exit_code == 0, submit.output
    from producer.client import Client
    from producer.errors import InvalidJobError

    app = Client().app
    app.backend.mark_as_failure("failed-cli", InvalidJobError("input.uri: no such object"))
    # When a person waits for it
    wait = runner.invoke(cli, ["wait", "failed-cli"])
    # Then the failure, at once: no bar (was one at "submitted 0:00:00" before the error)
    assert wait.exit_code == 3, wait.output
    assert "submitted" not in wait.output and "0:00:00" not in wait.output, wait.output
    assert _one_error_line(wait.output) == (
        "error: job failed-cli failed: InvalidJobError: input.uri: no such object")


def test_the_demo_names_each_of_its_two_times(capsys: pytest.CaptureFixture[str]) -> None:
    from producer.cli.common import print_result
    from producer.cli.fleet import demo_line
    from tests.producer.cost.test_cost import make_result

    # Given a demo's job: 30.60 s on the worker, 33.6 s from submit to result (issue 54,
    # point 10: both were printed as "wall", unexplained)
    result = make_result("demo-1", "demo", node="demo@host", finished_at=time.time(),
                         wall_s=30.6, video_seconds=2, prices=None)
    print_result(result)
    print(demo_line(result, 33.6, "wan2.1-vae"))
    out = capsys.readouterr().out
    assert "wall 30.60 s" in out.splitlines()[0]
    # Then the demo's own line says which is which, and gives the other in its words
    last = out.splitlines()[-1]
    assert last.startswith("demo: 32 frames, 1 segment, 33.6 s from submit to result with the "
                           "worker's start, of which the run on the worker (the wall above) "
                           "30.60 s (wan2.1-vae, "), last
    assert "wall 33" not in out
