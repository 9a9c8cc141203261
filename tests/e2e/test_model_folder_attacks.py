"""Hostile generate model folders through real Redis, SeaweedFS and a Celery worker.

Each attack (``tests/worker/generate/attacks.py``) once cost gigabytes, hung a job until its
time limit, loaded files from outside the roots or unpickled weights. Now each job fails at
once (FAILURE, a fatal ``InvalidJobError`` naming ``generate.model`` and the file, no retry),
and the same worker runs a good job afterwards.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.errors import JobFailed
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.worker.generate.attacks import ATTACKS, attacked
from tests.worker.generate.tiny import as_git_clone, save_tiny_model, tiny_generate, without

pytestmark = pytest.mark.e2e
TIME_LIMIT_S = 300
FAST_S = 15.0  # a refusal comes from small reads: seconds at most, never the time limit


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the worker's roots, a folder outside them, the tiny model inside the roots)."""
    roots, outside = tmp_path_factory.mktemp("roots"), tmp_path_factory.mktemp("outside")
    return roots, outside, save_tiny_model(roots / "tiny-wan")


def _spec(model: Path, bucket: str, **kw: Any) -> JobSpec:
    return JobSpec(job_id=f"attack-{uuid.uuid4().hex[:10]}", tenant="attacks",
                   generate=tiny_generate(model, **kw), time_limit_s=TIME_LIMIT_S,
                   output=OutputSpec(uri=f"s3://{bucket}/out"), video=VideoSpec(segment_frames=4))


def _run_attacks(names: list[str], redis_url: str, worker_factory: Any, s3_bucket: str,
                 place: tuple[Path, Path, Path]) -> None:
    roots, outside, model = place
    redis.Redis.from_url(redis_url).flushdb()
    (worker,) = worker_factory(1, env={"FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
                                       "FRAMEFLEET_FILE_ROOTS": str(roots)})
    client = Client(broker_url=redis_url, backend_url=redis_url)
    for name in names:
        # Given a copy of the model with one hostile change
        bad, rel = attacked(model, roots / uuid.uuid4().hex[:8], outside, name)
        t0 = time.monotonic()
        handle = client.submit(_spec(bad, s3_bucket))
        # Then the job fails, fatally and at once, naming the field and the file
        with pytest.raises(JobFailed) as e:
            handle.wait(timeout=60)
        took = time.monotonic() - t0
        assert handle.status() == "FAILURE", name
        text = e.value.message
        assert text.startswith("generate.model: "), (name, text)
        assert f"{bad.as_uri()}/{rel}" in text and ATTACKS[name][1] in text, (name, text)
        # fatal: InvalidJobError, or its PathRefusedError for a path outside the roots
        assert e.value.kind in ("InvalidJobError", "PathRefusedError"), (name, e.value.kind)
        assert took < FAST_S, (name, took)
        shutil.rmtree(bad, ignore_errors=True)
    assert "Retry in" not in worker.log_text()  # fatal: no retry loop, no poison cap
    # And the same worker runs a good job afterwards
    result = client.submit(_spec(model, s3_bucket)).wait(timeout=120)
    assert result.manifest.frames == 9


def test_links_devices_and_fifos_are_refused(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str,
    place: tuple[Path, Path, Path],
) -> None:
    names = ["dev-zero vae config", "fifo scheduler config", "transformer folder outside",
             "model_index.json outside"]
    _run_attacks(names, redis_url, worker_factory, s3_bucket, place)


def test_absurd_configs_and_pickles_are_refused(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str,
    place: tuple[Path, Path, Path],
) -> None:
    names = ["100000 transformer layers", "100000 text encoder layers", "rope_max_seq_len 1e7",
             "torch.save transformer", "pickled text encoder", "zip named .safetensors"]
    _run_attacks(names, redis_url, worker_factory, s3_bucket, place)


def test_a_cloned_model_runs_and_a_missing_tokenizer_is_named(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str,
    place: tuple[Path, Path, Path],
) -> None:
    roots, _, model = place
    redis.Redis.from_url(redis_url).flushdb()
    worker_factory(1, env={"FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
                           "FRAMEFLEET_FILE_ROOTS": str(roots),
                           "FRAMEFLEET_MAX_MODEL_FILES": "100"})
    client = Client(broker_url=redis_url, backend_url=redis_url)
    # Given a git clone of the model: its .git/ holds 200 objects (the limit is 100 entries)
    # and a 300 MiB second copy of a weight (over the 256 MiB limit of non-weight files)
    clone = as_git_clone(model, roots / f"clone-{uuid.uuid4().hex[:6]}")
    # Then a job on it runs
    result = client.submit(_spec(clone, s3_bucket)).wait(timeout=120)
    assert result.manifest.frames == 9
    # Given a folder without its tokenizer/
    bare = without(model, roots / f"bare-{uuid.uuid4().hex[:6]}", "tokenizer")
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as e:
        client.submit(_spec(bare, s3_bucket)).wait(timeout=60)
    # Then the job fails at once, naming the folder that is missing
    assert e.value.kind == "InvalidJobError"
    assert e.value.message == (f"generate.model: {bare.as_uri()} has no tokenizer (tokenizer/ "
                               "missing; model_index.json names it)")
    assert time.monotonic() - t0 < FAST_S
