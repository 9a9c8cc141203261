"""Which tests may run side by side (``make test`` runs the suite in two steps:
``tests/passes.py``).

The xdist pass runs every test not marked ``serial`` over ``pytest-xdist`` workers
(``-n``, ``--dist loadfile``): each worker is its own pytest session, so it starts its own Redis
and SeaweedFS (session fixtures, free loopback ports, its own temporary folders), and a module's
tests stay together on one worker (their module fixtures are built once, in order). Most of
the suite's time is spent in subprocesses (Celery workers, servers) that need cores of their
own: the Makefile starts two workers on 2 or 3 cores and half as many as cores from 4 up
(the pass waits more than it computes: 0.77 of a core busy in one process on 2 cores).

The ``serial`` tests are those whose assertions depend on the machine's load, or that take
host-wide names. They are marked here, by marker and module, so that the tests themselves need
no change, and split in three:

- two lanes (two pytest processes, each running its lane's tests one at a time, started with
  the xdist pass and beside it: they mostly wait). ``first_hour_lane``: everything that takes
  host-wide names, the README's quickstart and first hour (weed's default ports and their
  sockets in ``/tmp``) and the compose fleet (its host ports), and the browser tests of the
  page, Flower and the API's load test; and, for balance, four of the xdist pass's longest
  modules (the compile cache, the first minute, the worker-start and generate benches' tiny
  runs). ``faults_lane``: the ``chaos`` tests (faults and outages whose bounds hold with every
  core busy), the previews seen while a paced job runs (real time, no host-wide names) and,
  for balance, the compile artifacts' module and the soak bench's tiny run;
- ``alone`` (the last pass, one test at a time, nothing beside it): the tests that busy every
  core on purpose and time what a loaded host does (a pool process replaced on busy cores, a
  host lost or slow while its cores spin), and the CPU-time estimate checked against a real
  decode.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import pytest

#: Markers whose tests run in the faults lane.
FAULT_MARKERS = ("chaos",)

#: Markers whose tests run in the first-hour lane (the compose fleet's host ports).
FIRST_HOUR_MARKERS = ("docker",)

#: Modules (paths from the repository root) of the first-hour lane.
SERIAL_MODULES = frozenset({
    "tests/test_quickstart.py",
    "tests/e2e/test_first_hour.py",
    "tests/e2e/test_first_hour_cli.py",
    "tests/e2e/test_api_page.py",
    "tests/e2e/test_hls_playback.py",
    "tests/e2e/test_api_load.py",
    "tests/infra/test_flower.py",
    # Not for host-wide names, for balance: some of the xdist pass's longest modules, so that
    # the lane ends when the pass does (seconds on 2 cores, beside the rest: 57, 52)
    "tests/worker/lifecycle/test_compile_cache.py",
    "tests/worker/generate/test_first_minute.py",
    # and two more (a fresh clone, quiet 2-core AMD EPYC, docker's cache warm, minutes: xdist
    # 22:42, faults lane 21:00, first-hour 17:20; these took 92 s and 79 s in the xdist pass)
    "tests/bench/test_worker_start_tiny.py",
    "tests/bench/test_generate_tiny.py",
})

#: Modules of the faults lane besides the ``chaos`` tests.
FAULT_MODULES = frozenset({
    "tests/e2e/test_api_previews.py",
    "tests/e2e/test_previews.py",
    # For balance (a CI run on a loaded host, minutes: first-hour lane 29.3, xdist pass 25.5,
    # faults lane 20.7): the first-hour lane's longest module (88 s) and the xdist pass's
    # (119 s)
    "tests/worker/lifecycle/test_compile_artifacts.py",
    "tests/bench/test_soak_tiny.py",
})

#: Modules whose tests busy every core, or time the CPU against an estimate made a moment
#: before (a decode 4.5 times slower than its estimate with a compile beside it): each runs
#: with nothing beside it.
ALONE_MODULES = frozenset({
    "tests/worker/lifecycle/test_pool_start.py",
    "tests/e2e/test_host_loss.py",
    "tests/worker/run/test_cpu_estimate.py",
})


#: The xdist pass's longest modules (seconds on 2 cores, two xdist workers: 49, 43, 38, 37),
#: collected first so that the xdist workers start them first: one long module last kept a
#: worker busy alone for 90 s at the pass's end.
SLOW_FIRST = ("tests/test_services.py",
              "tests/worker/generate/test_generate_e2e.py",
              "tests/e2e/test_revoke_and_hints.py",
              "tests/bench/test_scripts.py")

def slow_first(items: list[pytest.Item]) -> None:
    """Move the tests of :data:`SLOW_FIRST` to the front, in that order; the rest keep theirs."""
    rank = {module: i for i, module in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def _marked(item: pytest.Item, names: tuple[str, ...]) -> bool:
    return any(item.get_closest_marker(name) is not None for name in names)


def lane(item: pytest.Item) -> str | None:
    """The marker of a ``serial`` test's place: ``alone``, ``first_hour_lane`` or
    ``faults_lane``; None for the others."""
    module = item.nodeid.split("::", 1)[0]
    if module in ALONE_MODULES:
        return "alone"
    if module in SERIAL_MODULES or _marked(item, FIRST_HOUR_MARKERS):
        return "first_hour_lane"
    if module in FAULT_MODULES or _marked(item, FAULT_MARKERS):
        return "faults_lane"
    return None


def mark_serial(items: list[pytest.Item]) -> None:
    """Mark every test that must not run among the others ``serial`` (``-m "not serial"``
    selects the others), and with its place's marker (``lane``)."""
    for item in items:
        where = lane(item)
        if where is not None:
            item.add_marker(pytest.mark.serial)
            item.add_marker(getattr(pytest.mark, where))


def worker_index() -> int:
    """This session's number among those running at once: its pass's ``FRAMEFLEET_TEST_SLOT``
    (``tests/passes.py``: a lane's, or the first of the xdist pass's), plus a ``pytest-xdist``
    worker's own (``gw3`` is 3); 0 for a plain pytest."""
    slot = int(os.environ.get("FRAMEFLEET_TEST_SLOT", "0"))
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return slot + int(name.removeprefix("gw")) if name.startswith("gw") else slot


def own_database(url: str) -> str:
    """``url`` (a Redis the user gave the tests) with this worker's own database number, the
    URL's plus the worker's index: each worker flushes its database at its start."""
    index = worker_index()
    if index == 0:
        return url
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{base + index}"))
