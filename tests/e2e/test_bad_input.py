"""Bad input of every kind: FAILURE at once with a message naming the field or file, no retry,
nothing written, and the worker completes the next good job."""

from __future__ import annotations

import io
import os
import pickle
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from producer.app import QUEUE, TASK_NAME
from producer.client import Client, JobHandle
from producer.errors import JobConflictError, JobFailed
from producer.wire.spec import job_key, split_key
from tests.e2e.helpers import pattern_spec, push_undecodable, put_latents, verify_output

pytestmark = pytest.mark.e2e


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


# name → (object key, bytes, expected words in the error)
FILES: dict[str, tuple[str, bytes, str]] = {
    "nan": ("nan.npy", _npy(np.full((16, 2, 4, 4), np.nan, np.float32)), "NaN or Inf"),
    "inf": ("inf.npy", _npy(np.full((16, 2, 4, 4), -np.inf, np.float32)), "NaN or Inf"),
    "rank": ("rank.npy", _npy(np.zeros((16, 4, 4), np.float32)), "rank 4"),
    "channels": ("ch.npy", _npy(np.zeros((3, 2, 4, 4), np.float32)), "3 latent channels"),
    "zero-frames": ("zero.npy", _npy(np.zeros((16, 0, 4, 4), np.float32)), "empty latents"),
    "too-large": ("big.npy", _npy(np.zeros((16, 1, 40, 40), np.float32)), "exceed the limit"),
    "too-long": ("long.npy", _npy(np.zeros((16, 30, 2, 2), np.float32)), "frames exceed"),
    "corrupt-safetensors": ("bad.safetensors", b"\x20\x00\x00\x00\x00\x00\x00\x00{oops",
                            "corrupt safetensors"),
    "pickle-as-npy": ("evil.npy", pickle.dumps({"x": 1}), "not a plain .npy"),
    "torch-pt": ("z.pt", b"PK\x03\x04 not read at all", "input.format"),
}


MISSING = "file:///etc/framefleet-no-such-file"


def local(good: dict[str, Any], job_id: str, path: Path) -> dict[str, Any]:
    return {**good, "job_id": job_id, "input": {"uri": path.as_uri(), "format": "npy"}}


def _raw(client: Client, payload: Any, task_id: str | None = None) -> JobHandle:
    """Send a job payload as a hand-written producer would: no client-side validation; the
    task id is the job's key when the payload names a usable job_id, else a random one."""
    if task_id is None:
        try:
            task_id = job_key(*split_key(payload["job_id"], payload.get("tenant", "default")))
        except (KeyError, TypeError, ValueError):
            task_id = str(uuid.uuid4())
    client.app.send_task(TASK_NAME, args=[payload], task_id=task_id)
    return JobHandle(client.app, task_id)


def test_bad_inputs_fail_clearly_and_the_worker_stays_healthy(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    # One folder of local files is allowed; in it, a folder, a file and a FIFO nobody writes
    root = tmp_path / "root"
    (root / "dir.npy").mkdir(parents=True)
    (root / "f").write_bytes(b"x")
    os.mkfifo(root / "pipe.npy")
    (worker,) = worker_factory(1, env={"FRAMEFLEET_MAX_PIXELS": str(256 * 256),
                                       "FRAMEFLEET_MAX_FRAMES": "100",
                                       "FRAMEFLEET_MAX_MESSAGE_BYTES": "4096",
                                       "FRAMEFLEET_FILE_ROOTS": str(root)})
    good_uri = put_latents(s3, s3_bucket, "in/good.npy", latent_frames=2, fmt="npy")
    good = pattern_spec("good", good_uri, s3_bucket).model_dump(mode="json")
    outside = tmp_path / "outside"
    expected: dict[str, tuple[JobHandle, str]] = {}
    for name, (key, data, words) in FILES.items():
        s3.client().put_object(Bucket=s3_bucket, Key=f"in/{key}", Body=data)
        spec = pattern_spec(f"bad-{name}", f"s3://{s3_bucket}/in/{key}", s3_bucket)
        expected[name] = (client.submit(spec), words)
    missing = pattern_spec("bad-missing", f"s3://{s3_bucket}/in/nope.npy", s3_bucket)
    expected["missing-object"] = (client.submit(missing), "nope.npy")
    raw_cases: dict[str, tuple[dict[str, Any], str]] = {
        "unknown-decoder": ({**good, "job_id": "x1", "decoder": {"name": "sdxl-vae"}},
                            "decoder.name"),
        "bad-fps": ({**good, "job_id": "x2", "video": {"fps": 0}}, "video.fps"),
        "bad-crf": ({**good, "job_id": "x3", "video": {"crf": 99}}, "video.crf"),
        "bad-codec": ({**good, "job_id": "x4", "video": {"codec": "libx265"}}, "video.codec"),
        "traversal-job-id": ({**good, "job_id": "../../etc"}, "job_id"),
        "absolute-tenant": ({**good, "job_id": "x5", "tenant": "/root"}, "tenant"),
        "traversal-output": ({**good, "job_id": "x6", "output": {"uri": "s3://b/a/../../c"}},
                             "output.uri"),
        "oversized-message": ({**good, "job_id": "x7", "pad": "x" * 8000}, "byte limit"),
        "not-a-spec": ({"hello": "world"}, "job_id"),
        # Local paths outside FRAMEFLEET_FILE_ROOTS: one refusal, whatever is there
        "local-existing": ({**good, "job_id": "x8", "input": {"uri": "file:///etc/passwd",
                                                              "format": "npy"}},
                           "input.uri: file:///etc/passwd is outside the folders"),
        "local-missing": ({**good, "job_id": "x9", "input": {"uri": MISSING, "format": "npy"}},
                          f"input.uri: {MISSING} is outside the folders"),
        "dev-zero": ({**good, "job_id": "x10", "input": {"uri": "file:///dev/zero",
                                                         "format": "npy"}}, "is outside"),
        "local-output": ({**good, "job_id": "x11", "output": {"uri": outside.as_uri()}},
                         "output.uri"),
        # and inside them, the OS errors name the field and the file
        "local-directory": (local(good, "x12", root / "dir.npy"),
                            f"input.uri: {(root / 'dir.npy').as_uri()} is a directory"),
        "local-missing-inside": (local(good, "x13", root / "gone.npy"),
                                 f"input.uri: no such file: {(root / 'gone.npy').as_uri()}"),
        "local-not-a-folder": (local(good, "x14", root / "f" / "x.npy"),
                               "a parent of it is not a directory"),
        "local-fifo": (local(good, "x15", root / "pipe.npy"), "pipe.npy is not a regular file"),
    }
    for name, (payload, words) in raw_cases.items():
        expected[name] = (_raw(client, payload), words)
    # A spec sent under a task id that is not its key (tenant:job_id): refused, naming both
    expected["mismatched-task-id"] = (
        _raw(client, {**good, "job_id": "x16"}, task_id=str(uuid.uuid4())),
        "is not the job's key 'x16'")
    # A hand-made envelope whose body is not JSON, and raw garbage on the queue
    r.lpush(QUEUE, b"this is not a message at all")
    task_id = push_undecodable(r)
    expected["non-json-body"] = (JobHandle(client.app, task_id), "JSON only")
    # When they have all been delivered, and a good job comes after them
    done = client.submit(pattern_spec("good", good_uri, s3_bucket)).wait(timeout=120)
    # Then each bad job FAILED with a message naming what is wrong
    problems = []
    messages: dict[str, str] = {}
    for name, (handle, words) in expected.items():
        try:
            handle.wait(timeout=30)
            problems.append(f"{name}: succeeded")
        except JobFailed as e:
            if words not in e.message:
                problems.append(f"{name}: {e.kind}: {e.message!r} lacks {words!r}")
            if e.kind not in {"InvalidJobError", "InputNotFoundError", "PathRefusedError"}:
                problems.append(f"{name}: unexpected error kind {e.kind}")
            messages[name] = e.message
    assert not problems, "\n".join(problems)
    # A refused path says nothing of whether it exists; no folder was made for the output
    assert messages["local-existing"].replace("/etc/passwd", "X") == messages[
        "local-missing"].replace(MISSING.removeprefix("file://"), "X")
    assert not outside.exists()
    assert len(expected) >= 29
    # no retry loop, nothing written for the bad jobs, and the worker is alive and well
    log = worker.log_text()
    assert "Retry in" not in log and "Unrecoverable error" not in log
    assert "not a message envelope" in log
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3_bucket,
                                                          Prefix="out/")["Contents"]]
    assert all(k.startswith("out/default/good/") for k in keys), keys
    verify_output(s3, s3_bucket, done, tmp_path)
    assert worker.running and client.ping(timeout=2)


def test_job_id_reused_with_another_spec(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    (worker,) = worker_factory(1)
    uri = put_latents(s3, s3_bucket, "in/r.safetensors", latent_frames=2)
    first = pattern_spec("reused", uri, s3_bucket)
    done = client.submit(first).wait(timeout=60)
    other = pattern_spec("reused", uri, s3_bucket, segment_frames=3)
    # The client refuses it …
    with pytest.raises(JobConflictError):
        client.submit(other)
    # … and a producer that bypasses the client, sending it under the job's key, changes
    # nothing: the worker drops the message and stores nothing under the key (the job's
    # result and output stay those of the spec that claimed it)
    _raw(client, other.model_dump(mode="json"))
    deadline = time.monotonic() + 60
    while "nothing stored" not in worker.log_text():
        assert time.monotonic() < deadline, worker.log_text()[-3000:]
        time.sleep(0.2)
    handle = client.get("reused")
    assert handle.status() == "SUCCESS"
    assert handle.result().manifest.spec_digest == first.digest() == done.manifest.spec_digest
