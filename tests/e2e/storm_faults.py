"""The storm's faults, applied in lanes (``tests/e2e/storm.py``): the fleet's lane kills pool
processes and hosts, restarts Redis, S3 and gateway replicas, pauses S3 and cancels jobs; each
host's lane cuts its path to Redis (longer than the lease: the host is taken for lost and its
run becomes a zombie) or to S3 (seconds), or slows its path to S3 (``tbf``), then heals it.

Each lane runs on a thread of the services' namespace of its own (``Netns.twin``): a lane
reads the jobs' states and restarts services there, and never waits behind another lane.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import psutil

from tests.e2e.storm import Fault
from tests.e2e.storm_fleet import StormFleet

#: How long a fault on a host waits for a job to run there.
BUSY_WAIT_S = 3.0


def _retry(what: Callable[[], None], tries: int = 5) -> None:
    """A heal must land: a path left cut would hold the host's jobs past the storm."""
    for attempt in range(tries):
        try:
            what()
            return
        except RuntimeError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)


def _pools(launcher: int) -> dict[str, psutil.Process]:
    """Worker node name (``cpu0@storm-a``) → its pool process, under a host's launcher
    (launcher → Celery main processes, named by ``-n`` → their pool processes)."""
    out = {}
    for main in psutil.Process(launcher).children():
        argv = main.cmdline()
        children = main.children()
        if "-n" in argv and children:
            out[argv[argv.index("-n") + 1]] = children[0]
    return out


class Faults:
    """What each fault did (``log``: fault index → one line) and the jobs it hit."""

    def __init__(self, fleet: StormFleet) -> None:
        self.fleet, self.plan = fleet, fleet.plan
        self.log: dict[int, str] = {}
        self.kills: list[tuple[float, list[str]]] = []  # (unix time, jobs running there)
        self.cuts: list[tuple[float, list[str]]] = []  # cut from Redis: (unix time, jobs)
        self.errors: list[str] = []  # faults that could not be applied
        self.lock = threading.Lock()

    def run_lane(self, indices: list[int], t0: float) -> None:
        """Apply the faults ``indices`` one after another, each at its planned time
        (``t0``: the storm's start, monotonic) or when the one before ended."""
        for index in indices:
            fault = self.plan.faults[index]
            time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
            started = time.monotonic() - t0
            try:
                what = self.apply(index, fault)
            except Exception as e:  # noqa: BLE001 - the lane goes on; the test reports it
                what = f"{fault.kind} failed: {type(e).__name__}: {e}"
                with self.lock:
                    self.errors.append(what)
            line = f"at {started:.1f} s: {what}"
            with self.lock:
                self.log[index] = line
            print(f"t+{started:6.1f} s  {fault.lane(len(self.fleet.hosts)):<6} {what}",
                  flush=True)

    def apply(self, index: int, fault: Fault) -> str:
        if fault.kind in ("cut-redis", "cut-s3", "slow-s3"):
            return self.network(fault)
        if fault.kind in ("kill-pool", "kill-host"):
            return self.kill(fault)
        if fault.kind == "cancel":
            return self.cancel(index)
        return self.outage(fault)

    def busy(self, nodes: list[str]) -> list[str]:
        """The jobs running on ``nodes``, waiting up to ``BUSY_WAIT_S`` for one: a fault on a
        host lands mid-job when one comes (a tiny job runs for a fraction of a second)."""
        until = time.monotonic() + BUSY_WAIT_S
        while not (running := self.fleet.running_on(set(nodes))) and time.monotonic() < until:
            time.sleep(0.2)
        return running

    def network(self, fault: Fault) -> str:
        fleet, lab = self.fleet, self.fleet.lab
        i = fault.host_index(len(fleet.hosts))
        host, ns = fleet.hosts[i], fleet.namespaces[i]
        running = self.busy(host.nodenames)
        t = time.time()
        if fault.kind == "slow-s3":
            lab.throttle(ns, fleet.s3_port, fault.rate)
            time.sleep(fault.hold_s)
            _retry(lambda: lab.unthrottle(ns))
            return (f"slow-s3 {host.host} {fault.rate} {fault.hold_s:.1f} s "
                    f"({len(running)} running)")
        lab.cut(ns, fleet.redis_port if fault.kind == "cut-redis" else fleet.s3_port)
        time.sleep(fault.hold_s)
        _retry(lambda: lab.heal(ns))
        if fault.kind == "cut-redis":
            with self.lock:
                self.cuts.append((t, running))
        return f"{fault.kind} {host.host} {fault.hold_s:.1f} s ({len(running)} running)"

    def kill(self, fault: Fault) -> str:
        fleet = self.fleet
        i = fault.target % len(fleet.hosts)
        host = fleet.hosts[i]
        if fault.kind == "kill-pool":
            # The pool process of a worker that runs a job, else the target's.
            running = self.busy(host.nodenames)
            try:
                pools = _pools(host.pid)
            except psutil.Error:
                pools = {}
            if not pools:
                return f"kill-pool {host.host}: no pool process (host starting)"
            on = dict(zip(running, (m.get("worker") for m in fleet.metas_of(running)),
                          strict=True))
            node = next((n for n in sorted(pools) if n in on.values()),
                        sorted(pools)[fault.target % len(pools)])
            running = [k for k, n in on.items() if n == node]
            t = time.time()
            pools[node].send_signal(signal.SIGKILL)
            with self.lock:
                self.kills.append((t, running))
            return f"kill-pool {node} pid {pools[node].pid} ({len(running)} running)"
        running = self.busy(host.nodenames)
        t = time.time()
        host.kill()
        with self.lock:
            self.kills.append((t, running))
        time.sleep(3)
        fleet.start_host(i)
        return f"kill-host {host.host} ({len(running)} running)"

    def outage(self, fault: Fault) -> str:
        fleet = self.fleet
        if fault.kind == "restart-redis":
            fleet.redis.kill()
            fleet.redis.start()
            return "restart-redis"
        if fault.kind == "stop-s3":
            fleet.s3.restart()
            return "stop-s3 and start it again"
        if fault.kind == "pause-s3":
            fleet.s3.pause()
            time.sleep(4)
            fleet.s3.resume()
            return "pause-s3 4 s"
        assert fault.kind == "restart-gateway", fault
        gw = fleet.gateways[fault.target % len(fleet.gateways)]
        gw.stop()
        gw.start()
        return f"restart {gw.name}"

    def cancel(self, index: int) -> str:
        fleet = self.fleet
        assert fleet.client is not None
        done = []
        for job_id in self.plan.cancels[index]:
            until = time.monotonic() + 10
            while (key := fleet.keys_of.get(job_id)) is None and time.monotonic() < until:
                time.sleep(0.01)  # cancelled as soon as it is accepted
            if key is None:
                continue
            try:
                fleet.client.cancel(key)
                done.append(job_id)
            except Exception:  # noqa: BLE001 - Redis away: a cancel that did not land
                pass
        return f"cancel {done}"
