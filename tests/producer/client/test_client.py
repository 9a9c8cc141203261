"""Client behaviour against a real Redis, no worker: claims, states, cancel, and what the
client says when Redis is down or refuses its password (a real redis-server with
requirepass, and a closed port)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.errors import (
    BrokerAuthError,
    BrokerError,
    BrokerUnavailable,
    FramefleetError,
    InvalidJobError,
    StorageError,
    UnknownJobError,
)
from producer.ops.exporter import queue_depth
from producer.settings import Settings
from producer.wire.spec import JobSpec, OutputSpec
from tests.require import require_binary
from tests.services import REDIS_INSTALL, RedisServer, free_port


def _spec(job_id: str) -> JobSpec:
    return JobSpec.model_validate({"job_id": job_id, "input": {"uri": "s3://b/z.npy"},
                                   "decoder": {"weights": "random"},
                                   "output": {"uri": "s3://b/out"}})


def test_failed_publish_frees_the_job_id(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker went away")

    # Given a publish that fails after the job_id was claimed
    monkeypatch.setattr(client.app, "send_task", broken)
    with pytest.raises(ConnectionError):
        client.submit(_spec("lost-1"))
    monkeypatch.undo()
    # When the same job is submitted again, it is really queued this time
    client.submit(_spec("lost-1"))
    assert queue_depth(redis_url) == 1


def test_submit_clears_a_stale_cancel_flag(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    r.set("framefleet:cancel:fresh-1", "1")
    client.submit(_spec("fresh-1"))
    assert not r.exists("framefleet:cancel:fresh-1")
    assert r.get("framefleet:spec:fresh-1") == _spec("fresh-1").digest().encode()


# --- what a job is doing: UNKNOWN vs QUEUED, cancel of an unknown id, wait --------------------


def _pattern(job_id: str) -> JobSpec:
    return JobSpec.model_validate({"job_id": job_id, "input": {"uri": "s3://b/z.npy"},
                                   "decoder": {"name": "pattern"},
                                   "output": {"uri": "s3://b/out"}})


def test_state_tells_unknown_from_queued(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    client.submit(_pattern("queued-1"))
    # Celery says PENDING for both; the job registry tells them apart
    assert client.get("queued-1").status() == client.get("never-1").status() == "PENDING"
    assert client.state("queued-1").state == "QUEUED"
    unknown = client.state("never-1")
    assert unknown.state == "UNKNOWN" and "never submitted" in unknown.detail()


def test_cancel_of_an_unknown_id_is_refused_and_flags_nothing(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    with pytest.raises(UnknownJobError, match="never-2: no such job"):
        client.cancel("never-2")
    assert not r.exists("framefleet:cancel:never-2")
    # A submitted job is flagged; its state when asked comes back, named as status names it
    client.submit(_pattern("queued-2"))
    assert client.cancel("queued-2") == "QUEUED" == client.state("queued-2").state
    assert r.exists("framefleet:cancel:queued-2")


def test_wait_on_an_unknown_id_stops_after_its_grace(redis_url: str) -> None:
    client = Client(broker_url=redis_url, backend_url=redis_url)
    t0 = time.monotonic()
    with pytest.raises(UnknownJobError, match="never-3"):
        client.get("never-3").wait(timeout=30, unknown_grace_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 3


def test_a_raw_message_queued_or_held_by_a_worker_is_not_unknown(redis_url: str) -> None:
    from kombu import Consumer, Queue

    from producer.app import QUEUE, TASK_NAME

    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    # Given a job sent around the client (the registry knows nothing of it), then 600 more:
    # the newest are looked at first, a page at a time
    client.app.send_task(TASK_NAME, args=[{}], task_id="raw-1", priority=9)
    for i in range(600):
        client.app.send_task(TASK_NAME, args=[{}], task_id=f"other-{i}", priority=9)
    handle = client.get("raw-1")
    assert handle.state().state == "UNKNOWN" and handle.in_broker()
    # Then wait keeps waiting past its grace: the message is queued
    with pytest.raises(TimeoutError, match="raw-1 still UNKNOWN"):
        handle.wait(timeout=3, unknown_grace_s=0.3)
    # and so while a worker holds it, taken but not started (a pool process still warming up)
    taken: list[Any] = []
    with client.app.connection_for_read() as conn:
        consumer = Consumer(conn.default_channel, queues=[Queue(QUEUE)], prefetch_count=1,
                            callbacks=[lambda body, message: taken.append(message)])
        with consumer:
            conn.drain_events(timeout=5)  # the oldest message: raw-1
            assert [m.headers["id"] for m in taken] == ["raw-1"]
            assert redis.Redis.from_url(redis_url).hlen("unacked") == 1
            with pytest.raises(TimeoutError, match="raw-1 still UNKNOWN"):
                handle.wait(timeout=3, unknown_grace_s=0.3)
            # Once it is dropped (acknowledged, nothing stored: no job), it is unknown
            taken[-1].ack()
    t0 = time.monotonic()
    with pytest.raises(UnknownJobError, match="raw-1: no such job"):
        handle.wait(timeout=30, unknown_grace_s=0.3)
    assert time.monotonic() - t0 < 3


def test_a_resubmitted_job_withdraws_a_cancel_no_worker_acted_on(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    client.submit(_pattern("queued-3"))
    client.cancel("queued-3")
    client.submit(_pattern("queued-3"))
    assert not r.exists("framefleet:cancel:queued-3")
    assert queue_depth(redis_url) == 1  # still the one message: nothing queued twice


def test_a_spec_without_weights_is_refused_before_anything_is_claimed(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    spec = JobSpec.model_validate({"job_id": "noweights-1", "input": {"uri": "s3://b/z.npy"},
                                   "output": {"uri": "s3://b/out"}})
    with pytest.raises(InvalidJobError, match=r"^decoder\.weights: "):
        client.submit(spec)
    assert not r.exists("framefleet:spec:noweights-1") and queue_depth(redis_url) == 0


@pytest.mark.parametrize("uri", ["s3://b/elsewhere", "s3://b/videos-other", "s3://c/videos"])
def test_an_output_outside_the_fleet_prefix_is_refused_before_anything_is_claimed(
    redis_url: str, uri: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    settings = Settings(broker_url=redis_url, result_backend=redis_url,
                        output_prefix="s3://b/videos/")
    client = Client(settings=settings)
    spec = _spec("outside-1").model_copy(update={"output": OutputSpec(uri=uri)})
    with pytest.raises(InvalidJobError, match=r"^output\.uri: .*FRAMEFLEET_OUTPUT_PREFIX"):
        client.submit(spec)
    assert not r.exists("framefleet:spec:outside-1") and queue_depth(redis_url) == 0
    # Under the prefix it is queued
    inside = _spec("inside-1").model_copy(update={"output": OutputSpec(uri="s3://b/videos/x")})
    client.submit(inside)
    assert queue_depth(redis_url) == 1


def test_retry_and_started_states_carry_the_reason_and_the_worker(redis_url: str) -> None:
    client = Client(broker_url=redis_url, backend_url=redis_url)
    backend = client.app.backend
    backend.store_result("retrying-1", StorageError("S3 SlowDown on s3://b/z.npy"), "RETRY")
    js = client.state("retrying-1")
    assert js.state == "RETRY" and js.reason == "StorageError: S3 SlowDown on s3://b/z.npy"
    assert js.describe() == "retrying: StorageError: S3 SlowDown on s3://b/z.npy"
    backend.store_result("started-1", {"pid": 1, "hostname": "gpu0@host"}, "STARTED")
    assert client.state("started-1").describe() == "started on gpu0@host"


# --- the broker down, a wrong password, no password: a typed error within seconds ------------


class PasswordRedis(RedisServer):
    """redis-server with ``requirepass``."""

    def __init__(self, binary: str, workdir: Path, password: str) -> None:
        super().__init__(binary, workdir)
        self.password = password

    def argv(self) -> list[str]:
        return [*super().argv(), "--requirepass", self.password]


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PasswordRedis]:
    server = PasswordRedis(require_binary("redis-server", REDIS_INSTALL),
                           tmp_path_factory.mktemp("locked-redis"), "s3cret-pw")
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: Every client call that talks to Redis, on a fresh client (so none shares a connection).
CALLS: dict[str, Callable[[Client], object]] = {
    "submit": lambda c: c.submit(_pattern("b-1")),
    "status": lambda c: c.get("b-1").status(),
    "state": lambda c: c.state("b-1"),
    "wait": lambda c: c.get("b-1").wait(timeout=30),
    "cancel": lambda c: c.cancel("b-1"),
}
LIMIT_S = 5.0


def _fails(url: str, call: str, kind: type[Exception], backend: str | None = None) -> str:
    client = Client(broker_url=url, backend_url=backend or url)
    t0 = time.monotonic()
    with pytest.raises(kind) as info:
        CALLS[call](client)
    took = time.monotonic() - t0
    assert took < LIMIT_S, f"{call} took {took:.1f} s"
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_closed_port_is_broker_unavailable_within_seconds(call: str) -> None:
    port = free_port()
    message = _fails(f"redis://127.0.0.1:{port}/0", call, BrokerUnavailable)
    assert f"redis://127.0.0.1:{port}/0" in message and "connection refused" in message


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_wrong_password_is_an_auth_error_with_the_password_masked(
    locked_redis: PasswordRedis, call: str
) -> None:
    message = _fails(f"redis://:wrong-pw@127.0.0.1:{locked_redis.port}/0", call,
                     BrokerAuthError)
    assert f"redis://:**@127.0.0.1:{locked_redis.port}/0" in message
    assert "wrong-pw" not in message and "password was refused" in message


@pytest.mark.parametrize("call", sorted(CALLS))
def test_no_password_is_an_auth_error_saying_so(locked_redis: PasswordRedis, call: str) -> None:
    message = _fails(f"redis://127.0.0.1:{locked_redis.port}/0", call, BrokerAuthError)
    assert "requires a password and the URL has none" in message


def test_a_broker_down_behind_a_working_backend_names_the_broker(
    locked_redis: PasswordRedis,
) -> None:
    backend = f"redis://:{locked_redis.password}@127.0.0.1:{locked_redis.port}/0"
    port = free_port()
    message = _fails(f"redis://127.0.0.1:{port}/0", "submit", BrokerUnavailable, backend)
    assert message.startswith(f"broker redis://127.0.0.1:{port}/0: ")
    # The claim was freed: the job_id is not stuck
    assert redis.Redis.from_url(backend).get("framefleet:spec:b-1") is None


def test_the_typed_errors_sit_in_the_error_tree() -> None:
    assert issubclass(BrokerAuthError, BrokerError) and issubclass(BrokerError, ConnectionError)
    assert issubclass(BrokerUnavailable, FramefleetError)


def test_the_progress_bar_names_the_state_before_any_frame(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from producer.client.handle import _Bar
    from producer.client.jobstate import JobState

    for js, words in [
        (JobState("bar-1", "QUEUED"), "queued"),
        (JobState("bar-2", "STARTED", worker="gpu0@host"), "started on gpu0@host"),
        (JobState("bar-3", "RETRY", reason="StorageError: S3 SlowDown on [s3://b/k]"),
         "retrying: StorageError: S3 SlowDown on [s3://b/k]"),
    ]:
        bar = _Bar(js.job_id)
        bar.show(js)
        bar.close()
        shown = capsys.readouterr().out
        assert words in shown and "0/?" not in shown, shown


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose accept queue is full: new connections get no answer at all, as
    from a host behind a firewall that drops packets."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)
    try:
        yield port
    finally:
        for s in fillers:
            s.close()
        server.close()


@pytest.mark.parametrize("call", ["submit", "state"])
def test_a_broker_that_never_answers_fails_within_seconds(silent_port: int, call: str) -> None:
    message = _fails(f"redis://127.0.0.1:{silent_port}/0", call, BrokerUnavailable)
    assert "timed out" in message
