"""The host-loss sweeper against a real Redis and kombu's real Redis transport.

Messages are delivered through kombu (``basic_get``: kombu's ``unacked`` hash and index), then
the consumer vanishes without restoring them, as a host that loses power does.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from producer.app import TASK_NAME, make_app, redis_priority
from producer.errors import SettingsError
from producer.settings import Settings
from producer.state.broker import same_server
from producer.state.control import flags_for
from producer.state.keys import queue_lists as queue_names
from tests.e2e.helpers import pattern_spec
from tests.require import require_binary
from tests.services import REDIS_INSTALL, RedisServer
from worker.lifecycle.recovery import REQUEUED, RecoveryThread, Sweeper, sweeper_for

SETTINGS = Settings(max_time_limit_s=60, visibility_timeout_s=61, recovery_period_s=1,
                    recovery_grace_s=5)


def submit(app: Celery, job_id: str, priority: int = 5) -> None:
    """What Client.submit does: claim the job_id, then send the message."""
    spec = pattern_spec(job_id, "s3://b/in.npy", "b", priority=priority)
    assert flags_for(app).claim(spec.key, spec.digest()) is None
    app.send_task(TASK_NAME, args=[spec.model_dump(mode="json")], task_id=spec.key,
                  priority=redis_priority(priority))


def deliver_and_vanish(app: Celery, n: int) -> list[str]:
    """Receive ``n`` messages through kombu and drop the consumer without a restore."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        tags = []
        for _ in range(n):
            message = channel.basic_get("video")
            assert message is not None
            tags.append(str(message.delivery_tag))
        channel.qos.restore_at_shutdown = False  # the host died: nobody restores them
    return tags


def age(r: redis.Redis, tags: list[str], seconds: float) -> None:
    r.zadd("unacked_index", {t: time.time() - seconds for t in tags})


def queued(r: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(m) for q in queue_names("video") for m in r.lrange(q, 0, -1)]


def meta(r: redis.Redis, job_id: str) -> dict[str, Any]:
    raw = r.get(f"celery-task-meta-{job_id}")
    return json.loads(raw) if raw else {}


def sweeper(app: Celery, node: str) -> Sweeper:
    s = sweeper_for(app, node, SETTINGS)
    assert s is not None
    return s


def test_an_orphan_is_requeued_once_to_its_priority_list_marked_requeued(
    app: Celery, r: redis.Redis
) -> None:
    submit(app, "orphan", priority=8)
    (tag,) = deliver_and_vanish(app, 1)
    app.backend.store_result("orphan", {"frames_done": 3}, "PROGRESS",
                             request=type("R", (), {"hostname": "w1@lost-host", "id": "orphan",
                                                    "task": TASK_NAME, "args": [],
                                                    "kwargs": {}, "retries": 0,
                                                    "delivery_info": {}, "ignore_result": False,
                                                    "argsrepr": "", "kwargsrepr": ""})())
    assert meta(r, "orphan")["worker"] == "w1@lost-host"
    s = sweeper(app, "w2@other")
    # Within the grace period: left alone
    assert s.sweep() == []
    age(r, [tag], 6)
    (outcome,) = s.sweep()
    assert (outcome.job_id, outcome.verdict) == ("orphan", "restored")
    # Back on the list of its priority, once, marked redelivered; no longer unacked
    (message,) = queued(r)
    assert message["headers"]["id"] == "orphan" and message["headers"]["redelivered"]
    assert r.llen(f"video\x06\x16{redis_priority(8)}") == 1
    assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
    # The client sees REQUEUED and why
    state = meta(r, "orphan")
    assert state["status"] == REQUEUED
    assert "w1@lost-host was lost" in state["result"]["reason"]
    assert app.AsyncResult("orphan").state == REQUEUED
    assert s.sweep() == []
    # and the next run's STARTED overwrites it
    app.backend.store_result("orphan", {"pid": 1}, "STARTED")
    assert app.AsyncResult("orphan").state == "STARTED"


def test_what_is_left_alone(app: Celery, r: redis.Redis) -> None:
    for job_id in ("leased", "touched", "done", "unclaimed", "other-spec"):
        submit(app, job_id)
    tags = dict(zip(["leased", "touched", "done", "unclaimed", "other-spec"],
                    deliver_and_vanish(app, 5), strict=True))
    # kombu serves the lists in priority order, FIFO within one: same order as submitted
    ids = {t: json.loads(r.hget("unacked", t))[0]["headers"]["id"] for t in tags.values()}
    assert ids == {t: j for j, t in tags.items()}
    age(r, list(tags.values()), 100)
    r.set("framefleet:lease:leased", "w1@host 123 token", px=10_000)  # still renewed
    r.set("celery-task-meta-done", json.dumps({"status": "SUCCESS", "result": {}}))
    r.delete("framefleet:spec:unclaimed")
    r.set("framefleet:spec:other-spec", "another digest")
    s = sweeper(app, "w2@other")
    s.touch([tags["touched"]])  # a live worker holds it (waiting for its countdown)
    verdicts = {o.job_id: o.verdict for o in s.sweep()}
    assert verdicts == {"leased": "leased", "done": "final", "unclaimed": "unclaimed",
                        "other-spec": "unclaimed"}
    # Nothing queued; the finished one is acknowledged for its dead worker, the rest stay
    assert queued(r) == [] and r.hlen("unacked") == 4 and not r.hexists("unacked", tags["done"])
    assert "status" not in meta(r, "leased") and meta(r, "done")["status"] == "SUCCESS"
    # Once the lease has expired, that one comes back
    r.delete("framefleet:lease:leased")
    again = {o.job_id: o.verdict for o in s.sweep()}
    assert again == {"leased": "restored", "unclaimed": "unclaimed", "other-spec": "unclaimed"}
    assert [m["headers"]["id"] for m in queued(r)] == ["leased"]


def test_touch_only_refreshes_messages_still_held(app: Celery, r: redis.Redis) -> None:
    submit(app, "held")
    (tag,) = deliver_and_vanish(app, 1)
    s = sweeper(app, "w1@host")
    assert s.touch([tag, "acked-long-ago"]) == 1
    assert r.zscore("unacked_index", "acked-long-ago") is None
    assert r.zscore("unacked_index", tag) == pytest.approx(time.time(), abs=2)


def race(app: Celery, sweepers: list[Sweeper]) -> list[list[Any]]:
    """Both sweepers and kombu's own restore_visible at once; the sweepers' outcomes."""
    start = threading.Barrier(3)
    results: list[list[Any]] = [[], []]

    def sweep(i: int) -> None:
        start.wait()
        results[i] = sweepers[i].sweep()

    def kombu_restore() -> None:
        with app.connection_for_write() as conn:
            qos = conn.default_channel.qos
            start.wait()
            qos.restore_visible(start=0, num=1000, interval=1)

    threads = [threading.Thread(target=sweep, args=(0,)),
               threading.Thread(target=sweep, args=(1,)),
               threading.Thread(target=kombu_restore)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_two_sweepers_and_kombus_restore_race_each_message_comes_back_once(
    app: Celery, r: redis.Redis
) -> None:
    sweepers = [sweeper(app, "a@host"), sweeper(app, "b@host")]
    restored_by_sweepers = 0
    for rnd in range(3):
        ids = [f"race-{rnd}-{i}" for i in range(30)]
        for job_id in ids:
            submit(app, job_id)
        tags = deliver_and_vanish(app, len(ids))
        age(r, tags, 1000)  # past the grace and past kombu's visibility timeout (61 s)
        results = race(app, sweepers)
        back = sorted(m["headers"]["id"] for m in queued(r))
        assert back == sorted(ids), f"round {rnd}: {len(back)} messages for {len(ids)} jobs"
        assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
        ours = [o for res in results for o in res if o.verdict == "restored"]
        assert len({o.job_id for o in ours}) == len(ours)
        restored_by_sweepers += len(ours)
        for q in queue_names("video"):
            r.delete(q)
    print(f"race: 90 orphans, {restored_by_sweepers} restored by the sweepers, "
          f"{90 - restored_by_sweepers} by kombu")


def test_no_sweep_across_two_servers() -> None:
    assert same_server("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/1")
    assert not same_server("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6380/0")
    assert not same_server("redis://:a@127.0.0.1:6379/0", "redis://:b@127.0.0.1:6379/0")
    assert not same_server("filesystem://", "db+sqlite:///x")


def test_grace_must_cover_missed_touches() -> None:

    with pytest.raises(SettingsError, match="RECOVERY_GRACE_S"):
        Settings(recovery_period_s=10, recovery_grace_s=20)
    assert Settings(recovery_period_s=0, recovery_grace_s=1).recovery_period_s == 0  # off


def test_defaults_notice_a_lost_host_within_one_lease() -> None:
    from worker.concerns.lease import LEASE_TTL_S

    s = Settings()
    # Requeued one lease after the host's last sign of life, at the next round: within 15 s
    assert s.recovery_grace_s <= LEASE_TTL_S
    assert max(s.recovery_grace_s, LEASE_TTL_S) + s.recovery_period_s <= 15


def test_no_sweep_for_one_grace_after_a_late_or_failed_round(tmp_path: Path) -> None:
    """A round that comes late (this process stopped or starved: its neighbours may have been
    too) or fails (Redis away: every worker's touches failed) is followed by one grace of
    touching only, so that live workers can touch their messages before anyone judges them."""
    server = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path, appendonly=True)
    server.start()
    app = make_app(server.url, server.url, SETTINGS)
    r = redis.Redis.from_url(server.url)
    try:
        for job_id in ("late", "outage", "mine"):
            submit(app, job_id)
        late, outage, mine = deliver_and_vanish(app, 3)
        clock = [1000.0]
        thread = RecoveryThread(sweeper(app, "w@a"), SETTINGS.recovery_period_s,
                                held=lambda: [mine], clock=lambda: clock[0])
        grace, period = SETTINGS.recovery_grace_s, SETTINGS.recovery_period_s

        def rounds(n: float) -> list[str]:
            """``n`` rounds, one period apart; the jobs on the queue then."""
            for _ in range(int(n)):
                clock[0] += period
                thread.round()
            return [m["headers"]["id"] for m in queued(r)]

        thread.round()
        # Given an orphan, and a round that comes a whole grace late
        age(r, [late], 100)
        clock[0] += grace
        thread.round()
        # Then the orphan stays for one grace, while this worker's own message is touched
        assert queued(r) == [] and r.hexists("unacked", late)
        age(r, [mine], 100)
        assert rounds(grace / period - 1) == []
        assert r.zscore("unacked_index", mine) == pytest.approx(time.time(), abs=2)
        # and is requeued by the first round after it
        assert rounds(1) == ["late"]
        # Given Redis away for a round (the round logs and goes on)
        server.stop()
        thread.round()
        server.start()
        age(r, [outage], 100)
        # Then the orphan waits one grace from the failed round
        assert rounds(grace / period - 1) == ["late"]
        assert rounds(1) == ["late", "outage"]
        assert r.hexists("unacked", mine)  # held and touched all along
    finally:
        r.close()
        app.close()
        server.stop()
