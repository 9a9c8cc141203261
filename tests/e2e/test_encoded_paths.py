"""Percent-encoded traversal against FRAMEFLEET_OUTPUT_PREFIX and FRAMEFLEET_FILE_ROOTS, as an
attacker sends it: ``%2e%2e``, ``%2E%2E``, ``%2F..%2F``, ``%5C``, ``%252e%252e`` and ``%00`` in
``file://`` and ``s3://`` URIs. Each is first shown to be an attack (decoded the way a store
reads it, it leaves the prefix), then refused by the client at submit (the CLI, and
``Client.submit`` with a spec built past its validators) and by the worker on receipt (a raw
message): FAILURE naming the field, nothing written outside the prefix, and the worker then
runs a good job. Real Redis, SeaweedFS and a Celery worker; the CLI as a subprocess."""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
import redis

from producer.app import TASK_NAME
from producer.client import Client, JobHandle
from producer.errors import InvalidJobError, JobFailed
from producer.settings import Settings
from producer.wire.spec import JobSpec, OutputSpec
from tests.e2e.helpers import pattern_spec, put_latents
from tests.services import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: name → the part after the prefix: each decodes (once) to a path that leaves the prefix,
#: or to a name no store may take (NUL), or (double-encoded) to one a second decode would.
ATTACKS = {
    "dots-lower": "%2e%2e/escaped",
    "dots-upper": "%2E%2E/escaped",
    "encoded-slash": "x%2F..%2F..%2Fescaped",
    "encoded-backslash": "..%5Cescaped",
    "double-encoded": "%252e%252e/escaped",
    "nul": "x%00/escaped",
}


def naive(uri: str, times: int = 1) -> str:
    """The path (``file://``) or key (``s3://``) as the stores used to read it: the checked,
    quoted URI unquoted afterwards (``times`` over, for a double-decoding reader), then
    normalised the way a file system or an S3 gateway resolves ``..``."""
    path = urlsplit(uri).path
    for _ in range(times):
        path = unquote(path)
    return posixpath.normpath(path.replace("\\", "/"))


def names(message: str, field: str) -> bool:
    """Whether a worker's refusal names ``field`` first (``parse_spec`` says "invalid job
    spec: FIELD: …"; a rule says "FIELD: …")."""
    return re.match(rf"^(invalid job spec: )?{re.escape(field)}: ", message) is not None


def _cli(redis_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**base, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "400",
                               "FRAMEFLEET_BROKER_URL": redis_url, **env})


def _client(redis_url: str, **settings: str) -> Client:
    """The real client, with the fleet's prefix (and roots) in its own settings."""
    return Client(settings=Settings(broker_url=redis_url, result_backend=redis_url,
                                    **settings))  # type: ignore[arg-type]


def _raw(client: Client, payload: dict[str, Any]) -> JobHandle:
    """Send a payload past the client: no validation, the job's key as the task id."""
    client.app.send_task(TASK_NAME, args=[payload], task_id=payload["job_id"])
    return JobHandle(client.app, payload["job_id"])


def _failure(handle: JobHandle) -> JobFailed:
    with pytest.raises(JobFailed) as info:
        handle.wait(timeout=60)
    return info.value


def _unvalidated(spec: JobSpec, output: str) -> JobSpec:
    """``spec`` with ``output.uri`` set past pydantic's validators (what a careless caller
    gets from ``model_construct``): the client's rules must still refuse it."""
    return spec.model_copy(update={"output": OutputSpec.model_construct(uri=output)})


def _refused_everywhere(client: Client, redis_url: str, good: JobSpec, output: str,
                        field_env: dict[str, str], tag: str) -> JobFailed:
    """Refused by the CLI, by ``Client.submit`` past the validators, and by the worker."""
    r = redis.Redis.from_url(redis_url)
    cli = _cli(redis_url, "submit", "--input", good.input.uri if good.input else "",
               "--decoder", "pattern", "--job-id", f"cli-{tag}", "--output", output,
               **field_env)
    assert cli.returncode != 0, (tag, cli.stdout, cli.stderr)
    assert "--output: " in cli.stderr, (tag, cli.stderr)  # the flag typed (issue 54, point 4)
    with pytest.raises(InvalidJobError, match=r"^output\.uri: "):
        client.submit(_unvalidated(good.model_copy(update={"job_id": f"api-{tag}"}), output))
    assert not r.exists(f"framefleet:spec:cli-{tag}", f"framefleet:spec:api-{tag}")
    payload = {**good.model_dump(mode="json"), "job_id": f"raw-{tag}",
               "output": {"uri": output}}
    failed = _failure(_raw(client, payload))
    assert failed.kind == "InvalidJobError", (tag, failed.kind, failed.message)
    assert names(failed.message, "output.uri"), (tag, failed.message)
    return failed


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_encoded_traversal_under_file_roots(
    redis_url: str, worker_factory: Any, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    root = tmp_path / "R"
    (root / "in").mkdir(parents=True)
    (root / "out").mkdir()
    np.save(root / "in" / "z.npy", np.zeros((16, 2, 4, 6), np.float32))
    (root / "secret.npy").write_bytes((root / "in" / "z.npy").read_bytes())
    prefix = (root / "out").as_uri()
    env = {"FRAMEFLEET_FILE_ROOTS": str(root), "FRAMEFLEET_OUTPUT_PREFIX": prefix}
    (worker,) = worker_factory(1, env={**env, "FRAMEFLEET_DEVICE": "cpu"})
    client = _client(redis_url, file_roots=str(root), output_prefix=prefix)
    good = JobSpec.model_validate({"job_id": "good", "input": {"uri": (root / "in" / "z.npy")
                                                               .as_uri()},
                                   "decoder": {"name": "pattern"}, "output": {"uri": prefix}})
    before = _files(root)
    for name, tail in ATTACKS.items():
        output = f"{prefix}/{tail}"
        # the attack: every check passed on the quoted text, and the store's decode escapes
        if name == "double-encoded":
            assert naive(output) == f"{root}/out/%2e%2e/escaped"
            assert not naive(output, times=2).startswith(f"{root}/out/")
        elif name != "nul":
            assert not naive(output).startswith(f"{root}/out/"), naive(output)
        else:
            assert "\x00" in naive(output)
        failed = _refused_everywhere(client, redis_url, good, output, env, name)
        assert output in failed.message or name == "nul", failed.message
    # the inputs' fields too: refused on receipt, naming the field
    base = good.model_dump(mode="json")
    for job_id, payload, field in (
        ("in-dots", {**base, "input": {"uri": f"{prefix}/%2e%2e/secret.npy"}}, "input.uri"),
        ("in-slash", {**base, "input": {"uri": f"{root.as_uri()}/in%2F..%2Fsecret.npy"}},
         "input.uri"),
        ("w-dots", {**base, "decoder": {"name": "wan2.1-vae",
                                        "weights": f"{root.as_uri()}/in/%2e%2e"}},
         "decoder.weights"),
        ("img-nul", {**{k: v for k, v in base.items() if k not in ("input", "decoder")},
                     "generate": {"model": f"{root.as_uri()}/models/wan", "prompt": "x",
                                  "image": f"{root.as_uri()}/in/a%00.png"}}, "generate.image"),
    ):
        failed = _failure(_raw(client, {**payload, "job_id": job_id}))
        assert failed.kind == "InvalidJobError", (job_id, failed.kind, failed.message)
        assert names(failed.message, field), (job_id, failed.message)
    # nothing was written anywhere: not outside the prefix, not inside it
    assert _files(root) == before
    assert not (root / "escaped").exists() and not (tmp_path / "escaped").exists()
    # and the worker is healthy: a good job succeeds, under the prefix
    done = client.submit(good).wait(timeout=60)
    assert done.manifest.frames == 5
    assert (root / "out" / "default" / "good" / "manifest.json").is_file()
    assert {p for p in _files(root) - before if not p.startswith("out")} == set()
    assert worker.running and "Traceback" not in worker.log_text()


def test_encoded_traversal_in_s3_keys(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    prefix = f"s3://{s3_bucket}/videos"
    env = {"FRAMEFLEET_OUTPUT_PREFIX": prefix}
    (worker,) = worker_factory(1, env=env)
    client = _client(redis_url, output_prefix=prefix)
    good_in = put_latents(s3, s3_bucket, "in/good.npy", latent_frames=2, fmt="npy")
    put_latents(s3, s3_bucket, "secret.npy", latent_frames=2, fmt="npy")
    good = pattern_spec("good", good_in, s3_bucket).model_copy(
        update={"output": OutputSpec(uri=prefix)})
    for name, tail in ATTACKS.items():
        output = f"{prefix}/{tail}"
        if name == "double-encoded":
            assert naive(output, times=2) == "/escaped"
        elif name != "nul":
            assert not naive(output).startswith("/videos/"), naive(output)
        _refused_everywhere(client, redis_url, good, output, env, f"s3-{name}")
    base = good.model_dump(mode="json")
    for job_id, payload, field in (
        ("s3-in-dots", {**base, "input": {"uri": f"{prefix}/%2E%2E/secret.npy"}}, "input.uri"),
        ("s3-in-slash", {**base, "input": {"uri": f"s3://{s3_bucket}/in%2F..%2Fsecret.npy"}},
         "input.uri"),
        ("s3-in-double", {**base, "input": {"uri": f"s3://{s3_bucket}//secret.npy"}},
         "input.uri"),
    ):
        failed = _failure(_raw(client, {**payload, "job_id": job_id}))
        assert failed.kind == "InvalidJobError", (job_id, failed.kind, failed.message)
        assert names(failed.message, field), (job_id, failed.message)
    listed = s3.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert sorted(o["Key"] for o in listed) == ["in/good.npy", "secret.npy"]
    done = client.submit(good).wait(timeout=60)
    assert done.manifest_uri == f"{prefix}/default/good/manifest.json"
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert all(k.startswith("videos/default/good/") for k in keys
               if k not in {"in/good.npy", "secret.npy"}), keys
    assert worker.running and "Traceback" not in worker.log_text()

