"""Chaos: a storm of tiny jobs through the gateway and the Python client onto three CPU workers
on two hosts, while faults drawn from one seed hit every part of the fleet, its network paths
included.

The fleet lives in network namespaces (``tests/e2e/storm_fleet.py``): real Redis
(append-only, every write fsynced), SeaweedFS and two gateway replicas (``framefleet api``) in
the services' one, and two "hosts" (``tests/e2e/hosts.py``: ``python -m worker --cpu N`` in a
process group of its own), each in a namespace of its own; one runs two workers, the other
one. Jobs: the pattern decoder on tiny latents of three shapes, half posted to ``/v1/jobs`` of
a gateway replica, half submitted with ``producer.client.Client``. Faults, at times drawn from
the seed (printed first; rerun one with ``FRAMEFLEET_STORM_SEED=…``), in lanes
(``tests/e2e/storm_faults.py``): SIGKILL a pool process or a whole host (started again 3 s
later); SIGKILL Redis and start it again, stop SeaweedFS and start it again, pause it (SIGSTOP,
4 s), restart a gateway replica; cancel some jobs; and on each host's own lane, cut it from
Redis longer than the lease (its run becomes a zombie), cut it from S3 for seconds, or slow its
path to S3 to 64 kbit/s-1 Mbit/s for seconds (``iptables`` and ``tc`` in its namespace).

At the end (``tests/e2e/storm_checks.py``): every job in a final state, none lost; no job
succeeded twice (the workers' logs); each SUCCESS has one output whose segments are identical
(sha256) to a fault-free in-process run of its shape; nothing of a job that ended was written
after its end (a zombie's write would be); the ledger holds one record per job; the workers'
``framefleet_jobs_total`` never counts more ends than there were (counts of a process killed
within a scrape period are missed: they die with it); no playlist of a final job left without
``#EXT-X-ENDLIST``; nothing written outside ``out/`` and ``ledger/``.

``make chaos`` (FRAMEFLEET_CHAOS_FULL=1): 1,000 jobs, 40 or more faults of each kind (kills,
outages, partitions, slow links), ``bench/results/storm-cpu.md``; ``make test``: a smoke storm
(30 jobs, 4 faults, one a partition). Needs root, ``iproute2`` and ``iptables``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chaos_helpers import FULL
from tests.e2e.netns import Lab, Netns, require_lab
from tests.e2e.storm import (
    FULL_FAULTS,
    SMOKE_FAULTS,
    Plan,
    reference_hashes,
    seed_from_env,
    submit_at,
)
from tests.e2e.storm_checks import check_outcome
from tests.e2e.storm_faults import Faults
from tests.e2e.storm_fleet import HOSTS, StormFleet
from tests.e2e.storm_metrics import Scraper
from tests.e2e.storm_report import results_md, summary
from tests.services import REPO_ROOT

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(1500 if FULL else 300),
              pytest.mark.usefixtures("file_roots")]

N_JOBS, FAULTS = (1000, FULL_FAULTS) if FULL else (30, SMOKE_FAULTS)
#: Faults land in this window after the first submit (a lane may run past it).
WINDOW_S = 660.0 if FULL else 15.0
#: Every job final within this long after the last fault.
SETTLE_S = 300.0 if FULL else 150.0
FINAL = {"SUCCESS", "FAILURE", "REVOKED"}
RESULTS = REPO_ROOT / "bench" / "results" / "storm-cpu.md"


class Storm:
    """The fleet in its lab, the faults, and the services' threads the storm's steps use."""

    def __init__(self, tmp: Path, lab: Lab, plan: Plan) -> None:
        self.lab, self.plan, self.began = lab, plan, time.monotonic()
        self.fleet = StormFleet(tmp, lab, plan)
        self.faults = Faults(self.fleet)
        self.threads: list[Netns] = []

    def thread(self) -> Netns:
        """A thread of the services' namespace of its own."""
        self.threads.append(self.lab.services.twin())
        return self.threads[-1]

    def close(self) -> None:
        self.fleet.stop()
        for t in self.threads:
            t.close()


@pytest.fixture
def storm(tmp_path: Path) -> Iterator[Storm]:
    require_lab()
    plan = Plan.draw(seed_from_env(), N_JOBS, FAULTS, WINDOW_S)
    print("\n" + plan.describe(len(HOSTS)), flush=True)
    with Lab(tuple(name for name, _ in HOSTS)) as lab:
        s = Storm(tmp_path, lab, plan)
        try:
            lab.services.run(s.fleet.start)
            yield s
        finally:
            s.close()


def test_storm(storm: Storm, tmp_path: Path) -> None:
    plan, fleet, faults, svc = storm.plan, storm.fleet, storm.faults, storm.lab.services
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    reference = reference_hashes(ref_dir)
    scraper = Scraper(fleet.metrics_urls, call=storm.thread().run)
    scraper.start()
    # Given jobs going in through both routes from the start
    t0 = time.monotonic()
    errors: list[BaseException] = []

    def submit_all() -> None:
        try:
            for n, job in enumerate(plan.jobs):
                time.sleep(max(0.0, t0 + submit_at(n, len(plan.jobs), WINDOW_S)
                               - time.monotonic()))
                fleet.submit(job, deadline=t0 + WINDOW_S + 120)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    submitter = storm.thread().spawn(submit_all)
    # When the faults land at their times, each lane on its own thread
    lanes = [storm.thread().spawn(lambda ix=ix: faults.run_lane(ix, t0))  # type: ignore[misc]
             for ix in plan.lanes(len(fleet.hosts)).values()]
    for lane in lanes:
        lane.result(timeout=WINDOW_S + 300)
    faults_done = time.monotonic()
    submitter.result(timeout=WINDOW_S + 180)
    assert not errors, errors
    assert len(fleet.submitted) == len(plan.jobs)
    # Then every job reaches a final state
    deadline = time.monotonic() + SETTLE_S
    while True:
        metas = svc.run(fleet.metas)
        open_jobs = [k for k, m in metas.items() if m.get("status") not in FINAL]
        if not open_jobs or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    settled = time.monotonic()
    scraper.stop()
    time.sleep(3.0)  # a zombie's write still in flight has had its chance to land
    figures = svc.run(lambda: check_outcome(fleet, faults, metas, reference, scraper))
    figures |= {"open": open_jobs, "storm_s": settled - t0, "faults_s": faults_done - t0,
                "wall_s": time.monotonic() - storm.began}
    report(storm, figures)
    assert not open_jobs, f"jobs lost (not final {SETTLE_S:.0f} s after the faults): {open_jobs}"
    assert not figures["problems"], figures["problems"]


def report(storm: Storm, f: dict[str, Any]) -> None:
    print(summary(storm.plan, f), flush=True)
    for problem in f["problems"]:
        print(f"storm problem: {problem}", flush=True)
    if FULL:
        RESULTS.write_text(results_md(storm.plan, storm.faults.log, len(HOSTS), f))

