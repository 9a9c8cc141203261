"""``Client.submit_many`` against a real Redis, no worker (issue 54, point 13): every guarantee
of a single submit, per job: its checks, the claim of its job_id, the same job for the same
spec, a conflict for another, a rerun after FAILURE; the very message a single submit sends;
a broker that fails mid-way frees what it did not queue."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu.exceptions import OperationalError

from producer.app import QUEUE
from producer.client import Client
from producer.client import bulk as bulk_module
from producer.errors import BrokerUnavailable, InvalidJobError, JobConflictError
from producer.state import keys
from producer.wire.spec import JobSpec

BASE = {"tenant": "acme", "input": {"uri": "s3://b/z.npy"}, "decoder": {"name": "pattern"},
        "output": {"uri": "s3://b/out"}}


def _spec(job_id: str, **changes: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, "job_id": job_id, **changes})


def _messages(r: redis.Redis) -> list[dict[str, Any]]:
    """Every message in the queue's priority lists: headers, properties and the spec sent."""
    out = []
    for key in r.scan_iter(match=f"{QUEUE}*"):
        if r.type(key) != b"list":
            continue
        for raw in r.lrange(key, 0, -1):
            message = json.loads(raw)
            body = json.loads(base64.b64decode(message["body"]))
            out.append({"key": key, "headers": message["headers"],
                        "priority": message["properties"]["priority"], "spec": body[0][0]})
    return out


@pytest.fixture
def fleet(redis_url: str) -> Iterator[tuple[Client, redis.Redis]]:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    yield Client(broker_url=redis_url, backend_url=redis_url), r
    r.flushdb()


def test_each_job_keeps_every_guarantee_of_a_single_submit(
        fleet: tuple[Client, redis.Redis]) -> None:
    client, r = fleet
    client.submit(_spec("old-1"))  # claimed earlier, by a single submit
    specs = [
        _spec("new-1"), _spec("new-2", priority=9),
        _spec("old-1"),  # the same spec again: the existing job
        _spec("old-1", priority=2),  # another spec under a claimed id: a conflict, alone
        _spec("weightless", decoder={"name": "wan2.1-vae"}),  # refused by the fleet's rules
        _spec("new-1"),  # the same job twice in one call: one job
    ]
    done: list[int] = []
    out = client.submit_many(specs, done.append)
    assert [o.ok for o in out] == [True, True, True, False, False, True]
    assert isinstance(out[3].error, JobConflictError) and "priority: 5 -> 2" in str(out[3].error)
    assert isinstance(out[4].error, InvalidJobError) and "decoder.weights" in str(out[4].error)
    assert [o.handle.key for o in out if o.handle] == [
        "acme:new-1", "acme:new-2", "acme:old-1", "acme:new-1"]
    assert done and done[-1] == len(specs)
    # Each job queued once, by its claim, with the spec's digest kept and its sent mark
    queued = _messages(r)
    assert sorted(m["headers"]["id"] for m in queued) == ["acme:new-1", "acme:new-2",
                                                          "acme:old-1"]
    for name in ("new-1", "new-2"):
        assert r.get(keys.claim(f"acme:{name}")) == _spec(name, **(
            {"priority": 9} if name == "new-2" else {})).digest().encode()
        assert r.zscore(keys.QUEUED, f"acme:{name}") is not None
    assert not r.exists(keys.claim("acme:weightless"))
    assert client.state("new-2", "acme").state == "QUEUED"


def test_the_message_is_the_one_a_single_submit_sends(fleet: tuple[Client, redis.Redis]) -> None:
    client, r = fleet
    client.submit(_spec("one", priority=8))
    client.submit_many([_spec("many", priority=8)])
    one, many = sorted(_messages(r), key=lambda m: m["headers"]["id"] != "acme:one")
    assert one["key"] == many["key"] and one["priority"] == many["priority"]
    a, b = one["headers"], many["headers"]
    for name in ("task", "timelimit", "kwargsrepr", "parent_id", "retries", "eta", "expires"):
        assert a[name] == b[name], name
    assert (a["argsrepr"], b["argsrepr"]) == ("[<JobSpec acme:one>]", "[<JobSpec acme:many>]")
    assert (a["root_id"], b["root_id"]) == ("acme:one", "acme:many")
    assert set(a) == set(b)  # the same headers, the enqueue stamp among them
    assert one["spec"] | {"job_id": "many"} == many["spec"]


def test_a_failed_job_submitted_again_runs_again(fleet: tuple[Client, redis.Redis]) -> None:
    client, r = fleet
    client.submit(_spec("failed-1"))
    client.app.backend.mark_as_failure("acme:failed-1", InvalidJobError("input.uri: gone"))
    r.delete(*[m for m in r.scan_iter(match=f"{QUEUE}*")])  # a worker took it, and failed
    (out,) = client.submit_many([_spec("failed-1")])
    assert out.ok and client.state("failed-1", "acme").state == "QUEUED"
    assert [m["headers"]["id"] for m in _messages(r)] == ["acme:failed-1"]


def test_a_broker_failing_mid_way_frees_what_it_did_not_queue(
        fleet: tuple[Client, redis.Redis], monkeypatch: pytest.MonkeyPatch) -> None:
    client, r = fleet
    monkeypatch.setattr(bulk_module, "CHUNK", 2)
    sent: list[str] = []
    real = bulk_module.send_job

    def send(app: Any, spec: JobSpec, *args: Any, **kwargs: Any) -> None:
        if spec.job_id == "c-3":  # the second chunk's first publish: the broker goes away
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        sent.append(spec.job_id)
        real(app, spec, *args, **kwargs)

    monkeypatch.setattr(bulk_module, "send_job", send)
    out = client.submit_many([_spec(f"c-{i}") for i in range(1, 6)])
    # The first chunk is queued; the rest refused with the broker's error, claims freed
    assert [o.ok for o in out] == [True, True, False, False, False]
    assert all(isinstance(o.error, BrokerUnavailable) for o in out[2:])
    assert sorted(m["headers"]["id"] for m in _messages(r)) == ["acme:c-1", "acme:c-2"]
    assert not any(r.exists(keys.claim(f"acme:c-{i}")) for i in (3, 4, 5))
    monkeypatch.undo()
    # and once it answers again, the same call queues the rest, the rest only
    again = client.submit_many([_spec(f"c-{i}") for i in range(1, 6)])
    assert all(o.ok for o in again)
    assert sorted(m["headers"]["id"] for m in _messages(r)) == [f"acme:c-{i}"
                                                                for i in range(1, 6)]
