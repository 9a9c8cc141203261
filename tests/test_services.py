"""The test servers themselves: real Redis, SeaweedFS with SigV4, Celery worker processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis
from botocore import UNSIGNED
from botocore.exceptions import ClientError, EndpointConnectionError
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.require import require_binary
from tests.services import (
    REDIS_INSTALL,
    RedisServer,
    S3Server,
    SwitchingEndpoint,
    WorkerFactory,
    WorkerProcess,
    free_port,
    free_port_pair,
    free_ports,
)
from tests.services.celery_worker import stop_workers
from tests.waiting import wait_for


def test_redis_answers_ping(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        assert client.ping()
    finally:
        client.close()


def test_redis_appendonly_survives_a_crash(tmp_path: Path) -> None:
    # Given a private appendonly server holding one key
    server = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path, appendonly=True)
    server.start()
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        client.set("job", "kept")
        client.close()
        # When it is SIGKILLed (no shutdown save) and started again on the same port
        port = server.port
        server.kill(signal.SIGKILL)
        assert not server.ping()
        server.start()
        # Then the key is still there
        assert server.port == port
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        assert client.get("job") == b"kept"
        client.close()
    finally:
        server.stop()
    assert not server.running


def test_switching_endpoint_moves_to_the_promoted_replica(tmp_path: Path) -> None:
    # Given a primary and its replica behind one address, a key written through it
    group = SwitchingEndpoint(require_binary("redis-server", REDIS_INSTALL), tmp_path,
                              down_after_s=0.5, switch_after_s=0.5)
    group.start()
    try:
        # One try per command: redis-py's default retries would wait for the switch
        client = redis.Redis.from_url(group.url(), socket_timeout=2, socket_connect_timeout=1,
                                      retry=Retry(NoBackoff(), 0))
        client.set("job", "kept")
        client.wait(1, 2000)  # on the replica too
        assert client.info("server")["tcp_port"] == group.primary.port
        # When the primary is SIGKILLed
        group.primary.kill(signal.SIGKILL)
        # Then the address refuses until the switch, and then leads to the promoted replica
        with pytest.raises(redis.ConnectionError):
            client.ping()
        assert group.wait_promoted(15) < 15
        assert client.info("server")["tcp_port"] == group.replica.port  # same URL, reconnected
        assert client.info("replication")["role"] == "master"
        client.set("after", "written")
        assert client.get("job") == b"kept"
        client.close()
    finally:
        group.stop()


def test_s3_object_round_trip(s3: S3Server, s3_bucket: str) -> None:
    client = s3.client()
    body = os.urandom(256 * 1024)
    client.put_object(Bucket=s3_bucket, Key="clips/a.mp4", Body=body)
    got = client.get_object(Bucket=s3_bucket, Key="clips/a.mp4")["Body"].read()
    assert got == body
    listed = client.list_objects_v2(Bucket=s3_bucket)["Contents"]
    assert [o["Key"] for o in listed] == ["clips/a.mp4"]


def test_s3_refuses_wrong_secret_and_anonymous(s3: S3Server, s3_bucket: str) -> None:
    s3.client().put_object(Bucket=s3_bucket, Key="secret", Body=b"x")
    wrong = s3.client(secret_key="not-the-secret", retries={"max_attempts": 1})
    with pytest.raises(ClientError) as refused:
        wrong.get_object(Bucket=s3_bucket, Key="secret")
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as refused:
        wrong.put_object(Bucket=s3_bucket, Key="other", Body=b"y")
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    anonymous = s3.client(signature_version=UNSIGNED, retries={"max_attempts": 1})
    with pytest.raises(ClientError) as refused:
        anonymous.get_object(Bucket=s3_bucket, Key="secret")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_s3_stop_start_keeps_data(s3: S3Server, s3_bucket: str) -> None:
    # Given an object in the shared server
    s3.client().put_object(Bucket=s3_bucket, Key="kept", Body=b"survives")
    endpoint = s3.endpoint_url
    # When the server is down, requests fail fast (connection refused) ...
    s3.stop()
    try:
        down = s3.client(retries={"max_attempts": 1}, connect_timeout=1)
        with pytest.raises(EndpointConnectionError):
            down.head_bucket(Bucket=s3_bucket)
    finally:
        # ... and after a start on the same ports and folder (later tests share the server)
        s3.start()
    # Then the endpoint and the object are unchanged
    assert s3.endpoint_url == endpoint
    got = s3.client().get_object(Bucket=s3_bucket, Key="kept")["Body"].read()
    assert got == b"survives"


def test_s3_pause_resume(s3: S3Server, s3_bucket: str) -> None:
    # A paused server accepts no request: the client times out instead of being refused.
    s3.pause()
    try:
        hung = s3.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=1)
        with pytest.raises(Exception, match=r"timeout|timed out"):
            hung.head_bucket(Bucket=s3_bucket)
    finally:
        s3.resume()
    s3.client().head_bucket(Bucket=s3_bucket)


def test_worker_starts_and_answers_ping(worker_factory: WorkerFactory, redis_url: str) -> None:
    from producer.app import make_app

    (worker,) = worker_factory(n=1)
    assert worker.nodename is not None and worker.nodename.startswith("w1@")
    app = make_app(broker_url=redis_url, backend_url=redis_url)
    try:
        replies = app.control.ping(destination=[worker.nodename], timeout=10.0, limit=1)
    finally:
        app.close()
    assert replies == [{worker.nodename: {"ok": "pong"}}]
    # Stopping kills the whole process group: no pool child is left behind.
    pgid = worker.pid
    worker.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_idle_workers_are_killed_and_a_busy_one_ends_its_job(
    tmp_path: Path, worker_env: dict[str, str], s3: S3Server, s3_bucket: str
) -> None:
    """``stop_workers`` (the end of every test with workers): SIGKILL when the broker holds
    nothing unacknowledged, a warm shutdown that lets the running job end otherwise."""
    from producer.client import Client
    from tests.e2e.helpers import pattern_spec, put_latents

    server = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path / "redis")
    server.start()
    env = {**worker_env, "FRAMEFLEET_BROKER_URL": server.url,
           "FRAMEFLEET_RESULT_BACKEND": server.url}
    client = Client(broker_url=server.url, backend_url=server.url)
    try:
        idle = [WorkerProcess(f"idle{i}", tmp_path / "workers", env) for i in range(2)]
        for worker in idle:
            worker.start()
        for worker in idle:
            worker.wait_ready()
        pgids = [w.pid for w in idle]
        assert stop_workers(idle) == "killed"
        for pgid in pgids:  # the group is gone, pool children included
            with pytest.raises(ProcessLookupError):
                os.killpg(pgid, 0)
        busy = WorkerProcess("busy", tmp_path / "workers", env)
        busy.start()
        busy.wait_ready()
        uri = put_latents(s3, s3_bucket, "in/long.npy", latent_frames=48, h=64, w=80,
                          fmt="npy")
        handle = client.submit(pattern_spec("long", uri, s3_bucket, segment_frames=32))
        wait_for(lambda: (p := handle.progress()) is not None and p.frames_done > 0, 60,
                 "the job's first frames")
        assert stop_workers([busy], timeout=120) == "warm"  # as long as the job needs
        assert not busy.running
        assert handle.wait(timeout=5).manifest.segments, busy.log_text()[-3000:]
    finally:
        server.stop()


def test_no_port_is_handed_out_twice_in_a_process() -> None:
    # A primary and its replica once got the same port, each asking on its own before either
    # had bound it: the kernel may give a closed ephemeral port again at once.
    singles = [free_port() for _ in range(300)]
    batches = [p for _ in range(50) for p in free_ports(3)]
    pair = free_port_pair(10000)
    handed = [*singles, *batches, pair, pair + 10000]
    assert len(set(handed)) == len(handed)
