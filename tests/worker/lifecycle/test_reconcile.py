"""The lost-message reconciler against a real Redis and kombu's real Redis transport.

A message is lost as a failover loses it: taken off the queue (kombu's ``BRPOP``) with no
``unacked`` record left, or never replicated (deleted from the list). The job's own records
(claim, spec, ``queued``) stay, as the client wrote them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from celery import Celery

from producer.client.send import send_job
from producer.settings import Settings, get_settings
from producer.state import keys
from producer.state.control import flags_for
from tests.e2e.helpers import pattern_spec
from worker.lifecycle.reconcile import Reconciler, app_sender, task_id

SETTINGS = Settings(max_time_limit_s=60, visibility_timeout_s=61, recovery_period_s=1,
                    recovery_grace_s=5, reconcile_after_s=5)


def submit(app: Celery, job_id: str) -> str:
    """What Client.submit does: claim with the spec, send, mark sent."""
    spec = pattern_spec(job_id, "s3://b/in.npy", "b")
    payload = spec.model_dump(mode="json")
    flags = flags_for(app)
    assert flags.claim(spec.key, spec.digest(), spec_json=json.dumps(payload)) is None
    send_job(app, spec, payload, get_settings())
    flags.mark_sent(spec.key)
    return spec.key


def listed(r: redis.Redis) -> list[str]:
    return [t for q in keys.queue_lists("video") for m in r.lrange(q, 0, -1)
            if (t := task_id(m)) is not None]


def age_all(r: redis.Redis, seconds: float) -> None:
    now = float(r.time()[0])
    for job in r.zrange(keys.QUEUED, 0, -1):
        r.zadd(keys.QUEUED, {job: now - seconds})


def reconciler(app: Celery, r: redis.Redis, sent: list[str] | None = None) -> Reconciler:
    send = app_sender(app)

    def recording(job: str, spec_json: str) -> None:
        if sent is not None:
            sent.append(job)
        send(job, spec_json)

    return Reconciler(r, r, SETTINGS.reconcile_after_s, "w1", recording)


def pop_lost(r: redis.Redis) -> Any:
    """Take the next message off the queue and drop it: kombu's BRPOP, then the primary
    lost before ``HSET unacked``."""
    for name in keys.queue_lists("video"):
        raw = r.rpop(name)
        if raw is not None:
            return raw
    raise AssertionError("queue empty")


def test_lost_message_is_sent_again_once(app: Celery, r: redis.Redis) -> None:
    # Given three queued jobs, one of whose messages was popped and lost
    jobs = [submit(app, f"j{i}") for i in range(3)]
    lost = task_id(pop_lost(r))
    assert lost in jobs
    age_all(r, 60)
    sent: list[str] = []
    rec = reconciler(app, r, sent)
    # When the reconciler looks twice (one miss is not enough)
    assert rec.round() == []
    assert rec.round() == [lost]
    # Then the lost job is on the queue again, exactly once, with the same spec
    assert sorted(listed(r)) == sorted(jobs)
    assert sent == [lost]
    assert int(r.get(keys.RESENT) or 0) == 1
    # and further rounds send nothing (the message is there; its time was set to now)
    age_all(r, 60)
    assert rec.round() == [] and rec.round() == []
    assert sorted(listed(r)) == sorted(jobs)


def test_found_in_unacked_or_received_is_not_sent(app: Celery, r: redis.Redis) -> None:
    # Given a job delivered through kombu (unacked), and one received by a worker whose
    # message is gone (acknowledged)
    held, received = submit(app, "held"), submit(app, "received")
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        first = channel.basic_get("video")
        second = channel.basic_get("video")
        assert first is not None and second is not None
        by_id = {first.headers["id"]: first, second.headers["id"]: second}
        by_id[received].ack()
        flags_for(app).mark_started(received)
        channel.qos.restore_at_shutdown = False
    age_all(r, 60)
    r.zadd(keys.QUEUED, {received: 1.0})  # the client's mark_sent raced the receipt
    rec = reconciler(app, r)
    # When the reconciler looks, more than twice
    for _ in range(3):
        assert rec.round() == []
    # Then nothing was sent; the received job left the watch, the held one stays
    assert listed(r) == []
    assert [j.decode() for j in r.zrange(keys.QUEUED, 0, -1)] == [held]
    assert by_id[held].headers["id"] == held


def test_final_or_released_job_leaves_the_watch(app: Celery, r: redis.Redis) -> None:
    # Given two lost jobs: one ended (its result is final), one whose claim was released
    done, gone = submit(app, "done"), submit(app, "gone")
    pop_lost(r), pop_lost(r)
    r.set(keys.result(done), json.dumps({"status": "SUCCESS", "task_id": done}))
    flags_for(app).release(gone)
    age_all(r, 60)
    rec = reconciler(app, r)
    assert rec.round() == [] and rec.round() == []
    assert listed(r) == [] and r.zcard(keys.QUEUED) == 0


def test_two_reconcilers_send_a_lost_job_once(app: Celery, r: redis.Redis) -> None:
    # Given a lost job, and two workers' reconcilers that both saw it missing once
    job = submit(app, "twice")
    pop_lost(r)
    age_all(r, 60)
    a, b = reconciler(app, r), reconciler(app, r)
    assert a.round() == [] and b.round() == []
    # When both confirm it
    sent = a.round() + b.round()
    # Then it is sent once (the compare-and-set moved its time)
    assert sent == [job]
    assert listed(r) == [job]


def test_a_young_job_is_left_alone(app: Celery, r: redis.Redis) -> None:
    submit(app, "young")
    pop_lost(r)
    rec = reconciler(app, r)
    assert rec.round() == [] and rec.round() == []  # sent < reconcile_after_s ago
    assert listed(r) == []


def test_settings_range() -> None:
    from producer.errors import SettingsError

    assert Settings(reconcile_after_s=0).reconcile_after_s == 0
    for bad in (0.5, -1, 100_000):
        with pytest.raises((SettingsError, ValueError)):
            Settings(reconcile_after_s=bad)


def test_the_exporter_serves_the_count(app: Celery, r: redis.Redis) -> None:
    from producer.ops.exporter import EXPORTER_REGISTRY, export_once

    submit(app, "counted")
    pop_lost(r)
    age_all(r, 60)
    rec = reconciler(app, r)
    rec.round(), rec.round()
    export_once(r, ["video"])
    assert EXPORTER_REGISTRY.get_sample_value("framefleet_jobs_resent_total") == 1.0
