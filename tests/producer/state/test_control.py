"""The job registry and the cancel/preempted flags, in Redis and in files (embedded mode)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer.app import make_app
from producer.settings import Settings
from producer.state.control import FileFlags, Flags, RedisFlags, flags_for
from producer.state.keys import FLAG_TTL_S, SPEC_TTL_S


@pytest.fixture(params=["redis", "files"])
def flags(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Flags]:
    if request.param == "redis":
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        yield RedisFlags(client)
        client.close()
    else:
        yield FileFlags(tmp_path / "flags")


def _id() -> str:
    return f"ctl-{secrets.token_hex(6)}"


def test_the_first_claim_wins_and_release_frees_the_job_id(flags: Flags) -> None:
    job = _id()
    assert flags.claim(job, "digest-a") is None
    # A second claim, whatever its digest, gets the registered one back
    assert flags.claim(job, "digest-b") == "digest-a"
    assert flags.claim(job, "digest-a") == "digest-a"
    flags.release(job)
    assert flags.claim(job, "digest-b") is None


def test_claims_racing_for_one_job_id_have_one_winner(flags: Flags) -> None:
    job = _id()
    results: list[str | None] = []
    barrier = threading.Barrier(8)

    def claim(n: int) -> None:
        barrier.wait(timeout=10)
        results.append(flags.claim(job, f"digest-{n}"))

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    winners = [n for n, got in enumerate(results) if got is None]
    assert len(results) == 8 and len(winners) == 1
    # Every loser was told the winner's digest
    registered = flags.claim(job, "late")
    assert registered is not None
    assert sorted(got for got in results if got is not None) == [registered] * 7


def test_a_new_claim_clears_a_stale_cancel_flag_an_old_one_does_not(flags: Flags) -> None:
    job = _id()
    flags.set_cancel(job)
    assert flags.cancelled(job)
    # A fresh submission of a job_id clears a cancel left from before
    assert flags.claim(job, "d", clear_cancel=True) is None
    assert not flags.cancelled(job)
    # A cancel of the running job survives a duplicate submission
    flags.set_cancel(job)
    assert flags.claim(job, "d", clear_cancel=True) == "d"
    assert flags.cancelled(job)
    flags.clear_cancel(job)
    assert not flags.cancelled(job)


def test_preempted_flags_are_per_node(flags: Flags) -> None:
    node = f"gpu0@{_id()}"
    assert not flags.preempted(node)
    flags.set_preempted(node)
    assert flags.preempted(node)
    assert not flags.preempted(f"gpu1@{node.split('@')[1]}")


def test_redis_keys_expire(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    flags = RedisFlags(r)
    job, node = _id(), f"gpu0@{_id()}"
    flags.claim(job, "d")
    flags.set_cancel(job)
    flags.set_preempted(node)
    assert 0 < r.ttl(f"framefleet:spec:{job}") <= SPEC_TTL_S
    assert 0 < r.ttl(f"framefleet:cancel:{job}") <= FLAG_TTL_S
    assert 0 < r.ttl(f"framefleet:preempted:{node}") <= FLAG_TTL_S


def test_flags_for_follows_the_result_backend(redis_url: str, tmp_path: Path) -> None:
    # A Redis backend keeps the flags in that Redis
    redis_app = make_app(redis_url, redis_url)
    job = _id()
    assert isinstance(flags_for(redis_app), RedisFlags)
    flags_for(redis_app).set_cancel(job)
    assert redis.Redis.from_url(redis_url).exists(f"framefleet:cancel:{job}")
    # The embedded mode keeps them as files under the settings' data folder
    settings = Settings(broker_url="filesystem://", data_dir=str(tmp_path / "data"))
    embedded = make_app(settings=settings)
    files = flags_for(embedded, settings)
    assert isinstance(files, FileFlags)
    files.set_cancel(job)
    assert (tmp_path / "data" / "flags" / "cancel" / job).exists()


def test_a_run_that_never_ended_is_counted_as_a_worker_loss(flags: Flags) -> None:
    job = _id()
    # Given a first run that started and ended (a retry: not final)
    assert flags.start_run(job, "gpu0@a 11 t1") == (0, None)
    flags.end_run(job, "gpu0@a 11 t1", final=False)
    # When the next run starts and its worker dies without ending it, twice
    assert flags.start_run(job, "gpu1@b 12 t2") == (0, None)
    assert flags.start_run(job, "gpu2@c 13 t3") == (1, "gpu1@b 12 t2")
    # Then the run after them sees two losses, the last one on gpu2@c
    assert flags.start_run(job, "gpu0@a 14 t4") == (2, "gpu2@c 13 t3")
    # A stale holder cannot end the current run; the job's end resets the losses
    flags.end_run(job, "gpu1@b 12 t2", final=True)
    assert flags.start_run(job, "gpu0@a 15 t5") == (3, "gpu0@a 14 t4")
    flags.end_run(job, "gpu0@a 15 t5", final=True)
    assert flags.start_run(job, "gpu0@a 16 t6") == (0, None)


def test_the_started_mark_is_taken_once(flags: Flags) -> None:
    job = _id()
    assert not flags.take_started(job)
    flags.mark_started(job)
    flags.start_run(job, "gpu0@a 1 t")
    flags.mark_started(job)
    assert flags.take_started(job)
    assert not flags.take_started(job)
    # and taking it leaves the run record alone
    assert flags.start_run(job, "gpu0@a 2 t") == (1, "gpu0@a 1 t")


def test_the_run_record_expires_with_the_claim(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    job = _id()
    RedisFlags(r).mark_started(job)
    assert 0 < r.ttl(f"framefleet:runs:{job}") <= SPEC_TTL_S
    RedisFlags(r).start_run(_id(), "gpu0@a 1 t")
    assert 0 < r.ttl(f"framefleet:runs:{job}") <= SPEC_TTL_S


def test_reset_forgets_the_run_record(flags: Flags) -> None:
    job = _id()
    flags.mark_started(job)
    flags.start_run(job, "gpu0@a 1 t")  # killed by the hard time limit: never ended
    flags.reset_runs(job)
    assert not flags.take_started(job)
    assert flags.start_run(job, "gpu0@a 2 t") == (0, None)


def test_a_run_killed_by_the_hard_limit_is_ended_once_and_only_if_it_had_not_ended(
    flags: Flags,
) -> None:
    job = _id()
    flags.start_run(job, "gpu0@a 12 t1")
    # Another process of the node, or another node: not the killed run
    assert not flags.end_killed_run(job, "gpu0@a", 1)
    assert not flags.end_killed_run(job, "gpu0@b", 12)
    # The killed process's run: ended, and once only
    assert flags.end_killed_run(job, "gpu0@a", 12)
    assert not flags.end_killed_run(job, "gpu0@a", 12)
    assert flags.start_run(job, "gpu0@a 13 t2") == (0, None)  # no worker loss left behind
    # A run that reached its end itself is not ended again
    flags.end_run(job, "gpu0@a 13 t2", final=True)
    assert not flags.end_killed_run(job, "gpu0@a", 13)


def test_a_stuck_run_is_marked_only_while_it_holds_the_record_and_its_end_forgets_it(
    flags: Flags,
) -> None:
    job = _id()
    assert flags.stuck(job) is None
    flags.start_run(job, "gpu0@a 12 t1")
    # Another process of the node, or another node: not the run that hung
    assert not flags.mark_stuck(job, "gpu0@a", 1, "decode", 900.4)
    assert not flags.mark_stuck(job, "gpu0@b", 12, "decode", 900.4)
    assert flags.stuck(job) is None
    # The hung run's process: marked, for the job's next run to read
    assert flags.mark_stuck(job, "gpu0@a", 12, "decode", 900.4)
    assert flags.start_run(job, "gpu1@b 13 t2") == (1, "gpu0@a 12 t1")
    assert flags.stuck(job) == ("decode", 900.0)
    # The job's end (the poison cap's FAILURE) forgets it, as it forgets the losses
    flags.end_run(job, "gpu1@b 13 t2", final=True)
    assert flags.stuck(job) is None
    assert flags.start_run(job, "gpu0@a 14 t3") == (0, None)
    # and a run that ended is never marked
    flags.end_run(job, "gpu0@a 14 t3", final=False)
    assert not flags.mark_stuck(job, "gpu0@a", 14, "upload", 5)


def test_ends_handed_over_are_taken_once_oldest_first(flags: Flags) -> None:
    while flags.take_ends():  # the session's Redis may hold others' ends
        pass
    for n in range(5):
        flags.hand_over_end(f"end-{n}", 60)
    taken: list[str] = []
    threads = [threading.Thread(target=lambda: taken.extend(flags.take_ends(limit=2)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == [f"end-{n}" for n in range(5)]
    assert flags.take_ends() == []
    flags.hand_over_end("a", 60)
    flags.hand_over_end("b", 60)
    assert flags.take_ends() == ["a", "b"]
