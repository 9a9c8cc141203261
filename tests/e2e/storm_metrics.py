"""The storm's scraper: every worker process's job counts, summed over its lives."""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

_SAMPLE = re.compile(r'^framefleet_jobs_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
_START = re.compile(r"^process_start_time_seconds ([0-9.e+]+)$", re.M)


def _here(fn: Callable[[], Any]) -> Any:
    return fn()


class Scraper(threading.Thread):
    """Scrapes every worker's ``/metrics`` (``urls``) every ``period_s`` and keeps, per process
    incarnation (URL and start time), the last ``framefleet_jobs_total`` per status: a
    SIGKILLed pool process's counts die with it, so the sum over incarnations is what the
    fleet counted (a count in the last ``period_s`` before a kill is missed). ``call(fn)``
    runs each round (in the services' network namespace: the workers' listeners are on their
    hosts' addresses)."""

    def __init__(self, urls: list[str], period_s: float = 0.5,
                 call: Callable[[Callable[[], Any]], Any] = _here) -> None:
        super().__init__(name="storm-scraper", daemon=True)
        self.urls, self.period_s, self.call = urls, period_s, call
        self.counts: dict[tuple[str, float], dict[str, float]] = {}
        self.stop_event = threading.Event()

    def scrape_once(self) -> None:
        for url in self.urls:
            try:
                with urllib.request.urlopen(f"{url}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue
            start = _START.search(text)
            if start is None:
                continue
            per: dict[str, float] = {}
            for labels, value in _SAMPLE.findall(text):
                status = re.search(r'status="([^"]+)"', labels)
                if status:
                    per[status[1]] = per.get(status[1], 0.0) + float(value)
            self.counts[(url, float(start[1]))] = per

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.call(self.scrape_once)
            self.stop_event.wait(self.period_s)

    def totals(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for per in self.counts.values():
            for status, value in per.items():
                total[status] = total.get(status, 0.0) + value
        return total

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
        self.call(self.scrape_once)
