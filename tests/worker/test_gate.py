"""The capture gate with plain threads: a capture runs only while the job thread is parked at
a yield point or outside the gate, the job thread waits for it to end, and nothing deadlocks
when the job thread itself blocks on a build that wants to capture."""

from __future__ import annotations

import itertools
import threading
import time

from worker.gate import CaptureGate


def test_a_capture_runs_only_between_the_job_threads_yield_points() -> None:
    gate = CaptureGate()
    events: list[tuple[str, float]] = []
    asked = threading.Event()

    def job() -> None:
        with gate.work():
            for _ in range(30):
                events.append(("work", time.monotonic()))
                time.sleep(0.01)  # device work: a capture must not start during this
                events.append(("work-end", time.monotonic()))
                gate.yield_point()

    def capture() -> None:
        asked.set()
        with gate.capture():
            events.append(("capture", time.monotonic()))
            time.sleep(0.05)
            events.append(("capture-end", time.monotonic()))

    t = threading.Thread(target=job)
    t.start()
    time.sleep(0.05)
    c = threading.Thread(target=capture)
    c.start()
    t.join(10)
    c.join(10)
    # Then the capture happened, and no work step overlapped it
    start = next(ts for name, ts in events if name == "capture")
    end = next(ts for name, ts in events if name == "capture-end")
    steps = [(a[1], b[1]) for a, b in itertools.pairwise(events)
             if a[0] == "work" and b[0] == "work-end"]
    assert len(steps) == 30
    assert all(b <= start or a >= end for a, b in steps)
    assert gate.waits == 1 and gate.waited_s > 0


def test_outside_the_gate_a_capture_does_not_wait() -> None:
    gate = CaptureGate()
    t0 = time.monotonic()
    with gate.capture():
        pass
    assert time.monotonic() - t0 < 0.5 and gate.waits == 0
    with gate.work(), gate.work():  # nests; the holder itself may capture
        with gate.capture():
            pass


def test_a_holder_blocked_on_a_build_parks_and_nothing_deadlocks() -> None:
    gate = CaptureGate()
    build = threading.Lock()
    built = threading.Event()

    def background_build() -> None:
        with build:  # the build holds its lock and wants to capture
            with gate.capture():
                built.set()

    with gate.work():
        build.acquire()  # let the build start while we hold the gate
        bg = threading.Thread(target=background_build)
        bg.start()
        build.release()
        time.sleep(0.05)
        # When the job thread waits for the build's lock, parked, the build can capture
        with gate.parked():
            with build:
                pass
        bg.join(5)
    assert built.is_set() and not bg.is_alive()
