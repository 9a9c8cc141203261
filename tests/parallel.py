"""Which tests may run side by side (``make test`` runs the suite in two passes).

The first pass runs every test not marked ``serial`` over ``pytest-xdist`` workers
(``-n``, ``--dist loadfile``): each worker is its own pytest session, so it starts its own Redis
and SeaweedFS (session fixtures, free loopback ports, its own temporary folders), and a module's
tests stay together on one worker (their module fixtures are built once, in order). Most of
the suite's time is spent in subprocesses (Celery workers, servers) that need cores of their
own: the Makefile starts half as many workers as cores, and none below 4 cores.

The second pass runs the ``serial`` tests alone, one at a time: the tests whose assertions
depend on owning the machine, or that take host-wide names. They are marked here, by marker and
module, so that the tests themselves need no change:

- ``chaos`` and ``docker`` tests: faults, outages and timings measured with every core busy,
  and the compose fleet;
- the README's quickstart and first hour: weed's default ports and their sockets in ``/tmp``,
  and a whole fleet of processes;
- tests that busy every core on purpose, or watch a job in real time (Chromium playing a live
  stream, previews seen while a paced job runs, the API's load test).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import pytest

#: Markers whose tests own the machine.
SERIAL_MARKERS = ("chaos", "docker")

#: Modules (paths from the repository root) whose tests own the machine.
SERIAL_MODULES = frozenset({
    "tests/test_quickstart.py",
    "tests/e2e/test_first_hour.py",
    "tests/e2e/test_first_hour_cli.py",
    "tests/worker/lifecycle/test_pool_start.py",
    "tests/e2e/test_api_page.py",
    "tests/e2e/test_hls_playback.py",
    "tests/e2e/test_api_previews.py",
    "tests/e2e/test_previews.py",
    "tests/e2e/test_api_load.py",
    "tests/infra/test_flower.py",
})


def is_serial(item: pytest.Item) -> bool:
    module = item.nodeid.split("::", 1)[0]
    return module in SERIAL_MODULES or any(
        item.get_closest_marker(name) is not None for name in SERIAL_MARKERS)


def mark_serial(items: list[pytest.Item]) -> None:
    """Add the ``serial`` marker to every test that must run alone (``-m "not serial"``
    selects the others)."""
    for item in items:
        if is_serial(item):
            item.add_marker(pytest.mark.serial)


def worker_index() -> int:
    """0 outside ``pytest-xdist``; else this worker's number (``gw3`` is 3)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name.removeprefix("gw")) if name.startswith("gw") else 0


def own_database(url: str) -> str:
    """``url`` (a Redis the user gave the tests) with this worker's own database number, the
    URL's plus the worker's index: each worker flushes its database at its start."""
    index = worker_index()
    if index == 0:
        return url
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{base + index}"))
