"""The first hour, third pass: what a newcomer meets, through the real ``framefleet`` command,
a real Redis, SeaweedFS and real worker processes.

Each test names the issue's point it shows: local files checked at submit (3), a ``models
tiny`` job that says its weights are random (4), a worker's start with its own lines only and
a package that builds without warnings (6), and the small ones (7).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from producer.api.page import HLS_JS_SHA256
from producer.state import keys
from tests.services import REPO_ROOT, S3Server, _Process
from tests.test_quickstart import NOISE, write_photo
from tests.wheel import build_wheel

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
FRAMEFLEET = str(Path(sys.executable).parent / "framefleet")


def cli(*args: str, env: dict[str, str], cwd: Path, timeout: float = 300) -> Any:
    """``framefleet ARGS`` as a user runs it, with only ``env`` of ours."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEFLEET_", "AWS_"))}
    return subprocess.run([FRAMEFLEET, *args], env={**base, "COLUMNS": "200", **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder with what the README's first minute makes: ``framefleet models tiny`` (TI2V
    layout) with its LoRA, and the reader's picture."""
    home = tmp_path_factory.mktemp("first-hour")
    out = cli("models", "tiny", "models/tiny", "--layout", "ti2v", "--lora", "style.safetensors",
              env={}, cwd=home)
    assert out.returncode == 0, out.stdout + out.stderr
    # Its own two lines, no dependency's
    assert out.stderr == "", out.stderr
    assert out.stdout.count("random weights: noise") == 2, out.stdout
    write_photo(home)
    yield home


def _env(redis_url: str, roots: Path | str) -> dict[str, str]:
    return {"FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
            "FRAMEFLEET_FILE_ROOTS": str(roots)}


def manifest_previews(s3: S3Server, bucket: str) -> int:
    """The previews fox-1's manifest counts (stored under its output's previews/)."""
    body = s3.client().get_object(Bucket=bucket, Key="out/default/fox-1/manifest.json")
    return int(json.loads(body["Body"].read())["generate"]["previews"])


def test_3_submit_refuses_a_missing_local_file_naming_the_field(made: Path,
                                                                redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    env = _env(redis_url, made)
    prompt = ["submit", "--prompt", "a fox", "--model", "models/tiny", "--size", "64x64",
              "--frames", "9", "--steps", "2", "--output", "out"]
    np.save(made / "clip.npy", np.zeros((16, 2, 4, 4), np.float32))
    # Named by the flag the user typed (issue 54, point 4), not the spec's field
    for args, field, path in [
        (["--image", "nope.png"], "--image", "nope.png"),
        (["--image", "photo.png", "--lora", "nope.safetensors:0.8"], "--lora #1",
         "nope.safetensors"),
    ]:
        out = cli(*prompt, *args, "--job-id", "missing-1", env=env, cwd=made)
        # Before: queued, then failed by a worker (exit 3). Now: refused at once, exit 1.
        assert out.returncode == 1, out.stdout + out.stderr
        assert out.stderr.startswith(f"error: {field}: no such file: {made / path} "), out.stderr
    out = cli("submit", "--input", "nope.npy", "--decoder", "pattern", "--output", "out",
              "--job-id", "missing-2", env=env, cwd=made)
    assert out.returncode == 1 and out.stderr.startswith(
        f"error: --input: no such file: {made / 'nope.npy'} "), out.stderr
    out = cli(*prompt[:3], "--model", "models/none", *prompt[5:], "--job-id", "missing-3",
              env=env, cwd=made)
    assert out.returncode == 1 and "error: --model: no such folder: " in out.stderr
    # Nothing was claimed or queued
    assert not r.exists(*(keys.claim(f"missing-{i}") for i in (1, 2, 3)))
    # A path under a root this host does not have is the workers' to judge: queued
    elsewhere = _env(redis_url, "/nonexistent-root-of-the-workers")
    out = cli("submit", "--input", "/nonexistent-root-of-the-workers/clip.npy", "--decoder",
              "pattern", "--output", "/nonexistent-root-of-the-workers/out", "--job-id",
              "theirs-1", env=elsewhere, cwd=made)
    assert out.returncode == 0 and out.stdout.strip() == "theirs-1", out.stdout + out.stderr
    # and a file that is there is accepted
    out = cli("submit", "--input", "clip.npy", "--decoder", "pattern", "--output", "out",
              "--job-id", "here-1", env=env, cwd=made)
    assert out.returncode == 0, out.stderr
    r.flushdb()


def test_4_and_7_a_models_tiny_job_says_random_weights_and_one_segment(
        made: Path, worker_factory: Any, s3: S3Server, s3_bucket: str, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    (worker,) = worker_factory(1, env={"FRAMEFLEET_FILE_ROOTS": str(made)})
    env = {**_env(redis_url, made), "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url}
    out = cli("submit", "--prompt", "a red fox in the snow", "--model", "models/tiny", "--size",
              "64x64", "--frames", "9", "--steps", "2", "--image", "photo.png", "--lora",
              "style.safetensors:0.8", "--output", f"s3://{s3_bucket}/out", "--job-id",
              "fox-1", "--wait", env=env, cwd=made)
    assert out.returncode == 0, out.stdout + out.stderr + worker.log_text()[-3000:]
    # The CLI's line says it, and "1 segment" (was "1 segments", and silent about noise)
    assert re.search(r"(?m)^SUCCESS fox-1: 9 frames, 1 segment, 64x64, wall [\d.]+ s, "
                     r"random weights: noise$", out.stdout), out.stdout
    assert "random weights: noise (generate.model is a folder of random weights" in out.stdout
    # Previews are on with no setting: a preview's URI comes before the SUCCESS line
    before = out.stdout.split("SUCCESS fox-1", 1)[0]
    assert re.search(rf"(?m)^(preview after step [12]/2: s3://{s3_bucket}/out/default/fox-1/"
                     rf"previews/step-000[12]\.mp4|previews: [12], the newest at "
                     rf"s3://{s3_bucket}/out/default/fox-1/previews/latest\.mp4)", before), before
    assert manifest_previews(s3, s3_bucket) >= 1
    # The manifest says it (was "random_weights": false)
    body = s3.client().get_object(Bucket=s3_bucket, Key="out/default/fox-1/manifest.json")
    manifest = json.loads(body["Body"].read())
    assert manifest["random_weights"] is True and manifest["generate"]["random_weights"] is True
    assert manifest["generate"]["loras"][0]["scale"] == 0.8 and manifest["generate"]["image"]
    # 7: the cost report's stage table prints four decimals, as the README says (was six)
    report = cli("cost", "report", "--since", "all", "--backend", redis_url, env=env, cwd=made)
    assert report.returncode == 0, report.stderr
    for title, column in (("cost per stage", 3), ("denoise per tier", 6)):
        table = report.stdout.split(title, 1)[1].split("└", 1)[0]
        rows = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines()
                if line.startswith("│")]
        assert rows and all(re.fullmatch(r"\d+\.\d{4}", row[column]) for row in rows), table


def test_7_cancel_says_the_state_status_says(made: Path, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    env = _env(redis_url, made)
    np.save(made / "clip.npy", np.zeros((16, 2, 4, 4), np.float32))
    out = cli("submit", "--input", "clip.npy", "--decoder", "pattern", "--output", "out",
              "--job-id", "waits-1", env=env, cwd=made)
    assert out.returncode == 0, out.stderr
    status = cli("status", "waits-1", env=env, cwd=made)
    assert status.stdout.startswith("waits-1: QUEUED"), status.stdout
    cancel = cli("cancel", "waits-1", env=env, cwd=made)
    # Was "(was PENDING)", a state no other command shows
    assert cancel.stdout.startswith("cancel requested for waits-1 (was QUEUED)"), cancel.stdout
    redis.Redis.from_url(redis_url).flushdb()


class Launcher(_Process):
    """``framefleet worker --cpu 1``, as a user starts it."""

    def start(self, env: dict[str, str], cwd: Path) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEFLEET_", "AWS_"))}
        self._spawn([FRAMEFLEET, "worker", "--cpu", "1"], {**base, **env}, cwd)


def test_6_a_worker_start_prints_its_own_lines_only(made: Path, redis_url: str,
                                                     tmp_path: Path) -> None:
    launcher = Launcher("framefleet worker", tmp_path / "worker.log")
    launcher.start({**_env(redis_url, made), "FRAMEFLEET_WARMUP_MODEL": str(made / "models/tiny"),
                    "FRAMEFLEET_METRICS_PORT": "0"}, made)
    try:
        launcher._wait_until(lambda: "framefleet worker process ready" in launcher.log_text(),
                             240, "a ready worker", 0.5)
    finally:
        launcher.stop(timeout=60)
    log = launcher.log_text()
    assert "model cache: " in log and " resident " in log, log  # the warm-up model loaded
    # None of the dependencies' start-up lines (torchao, torch, diffusers, transformers), no
    # loading bars, no deprecation of an argument of ours
    noise = [line for line in log.splitlines() if any(n in line for n in NOISE)
             or re.match(r"[WE]\d{4} ", line)]
    assert not noise, noise
    warnings = re.findall(r"(?m)WARNING/\S+\] (.*)$", log)
    assert all(w.startswith("broker persistence") for w in warnings), warnings


def test_6_the_package_builds_without_warnings_and_ships_hls_js(tmp_path: Path) -> None:
    wheel, output = build_wheel(tmp_path)
    # Was: "`project.license` as a TOML table is deprecated" (pyproject's license table)
    assert "Warning" not in output.replace("warning: build_py: byte-compiling", "").replace(
        "warning: install_lib: byte-compiling", ""), output
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        hls = z.read("producer/api/static/hls.min.js")
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert hashlib.sha256(hls).hexdigest() == HLS_JS_SHA256
    assert "producer/api/static/hls.js-LICENSE" in names
    assert re.search(r"(?m)^License-Expression: Apache-2.0$", metadata), metadata[:2000]
    assert "License-File: producer/api/static/hls.js-LICENSE" in metadata


def test_7_the_readme_has_no_leftover_fragment() -> None:
    # The paragraph moved with "Submit from Python" from the README to docs/python.md
    readme = (REPO_ROOT / "docs" / "python.md").read_text()
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    # The fragment was a paragraph of its own that began mid-sentence and repeated two
    # sentences of the one before it
    starts = [p.strip() for p in prose.split("\n\n") if p.strip()]
    assert not [p for p in starts if p.startswith("with its password masked")]
    assert readme.count("password masked (`redis://:**@host:6379/0`)") == 1
