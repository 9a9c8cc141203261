"""The stuck-job watchdog's thread (``worker.watchdog``): it fires once a run's progress stops
for its limit, in the stage last named, and never while beats come; driven here with a fake
clock, the process's exit replaced by a record, through random interleavings of its calls."""

from __future__ import annotations

import random
import tempfile
import threading
import time

import pytest

from worker.watchdog import STUCK_EXIT, Watchdog, dump_stacks, stage_label


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, dt: float) -> None:
        with self._lock:
            self.now += dt


class Fired:
    """What the watchdog did when it fired: on_stuck's arguments, then the exit status."""

    def __init__(self) -> None:
        self.stuck: list[tuple[str, str, float]] = []
        self.exits: list[int] = []
        self.done = threading.Event()

    def on_stuck(self, job: str):  # type: ignore[no-untyped-def]
        return lambda stage, idle: self.stuck.append((job, stage, idle))

    def exit(self, status: int) -> None:
        self.exits.append(status)
        self.done.set()


def _watchdog(clock: Clock, fired: Fired) -> Watchdog:
    return Watchdog(clock=clock, exit=fired.exit, stream=STACKS)


#: Where the fired watchdogs of these tests dump their stacks (a real file: faulthandler
#: writes to its descriptor).
STACKS = tempfile.TemporaryFile("w+")


def test_a_run_without_progress_for_its_limit_is_stuck_in_the_stage_last_named() -> None:
    clock, fired = Clock(), Fired()
    wd = _watchdog(clock, fired)
    wd.arm("job-1", 10.0, fired.on_stuck("job-1"))
    wd.beat("denoise")
    clock.advance(9.0)
    wd.beat("decode")  # progress: the clock starts again
    clock.advance(9.0)
    assert not fired.done.wait(0.5)
    wd.note("upload")  # a name, no progress
    clock.advance(1.5)
    assert fired.done.wait(5)
    assert fired.exits == [STUCK_EXIT]
    assert [(job, stage) for job, stage, _ in fired.stuck] == [("job-1", "upload")]
    assert fired.stuck[0][2] >= 10.0


def test_a_job_that_never_reports_is_stuck_in_start_or_where_it_waits() -> None:
    for note, stage in ((None, "start"), ("wait_device", "wait_device")):
        clock, fired = Clock(), Fired()
        wd = _watchdog(clock, fired)
        wd.arm("job", 5.0, fired.on_stuck("job"))
        if note:
            wd.note(note)
        clock.advance(5.0)
        assert fired.done.wait(5)
        assert fired.stuck[0][1] == stage


def test_disarmed_or_off_it_never_fires_and_another_runs_token_disarms_nothing() -> None:
    clock, fired = Clock(), Fired()
    wd = _watchdog(clock, fired)
    first = wd.arm("a", 5.0, fired.on_stuck("a"))
    wd.disarm(first)
    second = wd.arm("b", 5.0, fired.on_stuck("b"))
    wd.disarm(first)  # the first run's late end leaves the second armed
    clock.advance(6.0)
    assert fired.done.wait(5) and fired.stuck[0][0] == "b"
    # A limit of 0 is off: no thread, nothing fires
    off, fired_off = _watchdog(clock, Fired()), Fired()
    off.arm("c", 0, fired_off.on_stuck("c"))
    clock.advance(100.0)
    assert not fired_off.done.wait(0.3) and off._thread is None
    assert second is not first


def test_close_stops_the_thread_and_a_later_arm_starts_another() -> None:
    clock, fired = Clock(), Fired()
    wd = _watchdog(clock, fired)
    wd.arm("a", 5.0, fired.on_stuck("a"))
    thread = wd._thread
    assert thread is not None and thread.is_alive()
    wd.close()
    assert not thread.is_alive()
    wd.arm("b", 5.0, fired.on_stuck("b"))
    clock.advance(5.0)
    assert fired.done.wait(5) and fired.stuck[0][0] == "b"
    wd.close()


def test_a_recorder_that_hangs_does_not_keep_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("worker.watchdog.RECORD_TIMEOUT_S", 0.2)
    clock, fired = Clock(), Fired()
    wd = _watchdog(clock, fired)

    def never_answers(stage: str, idle: float) -> None:  # a Redis that does not answer
        threading.Event().wait()

    wd.arm("a", 1.0, never_answers)
    clock.advance(1.0)
    assert fired.done.wait(5) and fired.exits == [STUCK_EXIT]


def test_the_stacks_of_every_thread_go_to_the_stream() -> None:
    parked = threading.Event()

    def parked_here() -> None:
        parked.wait()

    t = threading.Thread(target=parked_here)
    t.start()
    try:
        with tempfile.TemporaryFile("w+") as f:
            dump_stacks(f)
            f.seek(0)
            text = f.read()
    finally:
        parked.set()
        t.join()
    assert text.count("(most recent call first)") >= 2
    assert "parked_here" in text and "test_the_stacks_of_every_thread_go_to_the_stream" in text


def test_stage_labels_are_bounded() -> None:
    assert stage_label("decode") == "decode" and stage_label("x" * 50) == "other"


def _actor(wd: Watchdog, clock: Clock, fired: Fired, lock: threading.Lock, name: str,
           r: random.Random, limit: float) -> None:
    token = None
    for _ in range(30):
        op = r.choice(("arm", "beat", "note", "disarm", "tick", "tick"))
        with lock:
            if op == "arm":
                token = wd.arm(name, limit, fired.on_stuck(name))
            elif op == "beat":
                wd.beat(r.choice(("denoise", "decode", None)))
            elif op == "note":
                wd.note("wait_device")
            elif op == "disarm" and token is not None:
                wd.disarm(token)
            else:
                clock.advance(r.uniform(0, limit / 3))
        if fired.done.is_set():
            return


def _schedule(seed: int, limit: float) -> None:
    rng = random.Random(seed)
    clock, fired, lock = Clock(), Fired(), threading.Lock()
    wd = _watchdog(clock, fired)
    actors = [threading.Thread(target=_actor, args=(wd, clock, fired, lock, name,
                                                    random.Random(rng.random()), limit))
              for name in ("a", "b")]
    started = time.monotonic()
    for t in actors:
        t.start()
    for t in actors:
        t.join(10)
    assert not any(t.is_alive() for t in actors), f"seed {seed}: deadlock"
    if not fired.done.is_set():
        wd.arm("last", limit, fired.on_stuck("last"))
        clock.advance(limit)
        assert fired.done.wait(5), f"seed {seed}: an idle run was never found"
    ((_, _, idle),) = fired.stuck
    assert idle >= limit, f"seed {seed}: fired after {idle} s of a {limit} s limit"
    assert fired.exits == [STUCK_EXIT]
    assert time.monotonic() - started < 10
    wd.close()


def test_random_interleavings_never_fire_early_never_deadlock_and_always_fire_late() -> None:
    """200 schedules: two threads arm, beat, name, disarm and move the clock at random. Every
    firing found the run idle for its limit at least; every schedule ends within seconds; and
    a run left armed without progress is always found."""
    for seed in range(200):
        _schedule(seed, limit=0.2)  # the thread looks every 0.02 s
