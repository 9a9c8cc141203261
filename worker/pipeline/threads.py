"""The one thread shape of the pipeline, used by the writer and every segment encoder: a
bounded queue, a stop flag, ``get(timeout=…)``, and errors kept for the owner instead of
dying silently."""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

T = TypeVar("T")


class QueueThread(threading.Thread, ABC, Generic[T]):
    """Consumes items in order until ``None`` (the end) arrives or ``stop`` is set.

    Subclasses implement ``handle(item)``, ``finish()`` (after the end marker) and
    ``aborted()`` (stopped or failed: clean up). ``put`` blocks while the queue is full
    (back-pressure) and raises the thread's error in the producer's thread.
    """

    def __init__(self, name: str, depth: int, stop: threading.Event | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.items: queue.Queue[T | None] = queue.Queue(maxsize=depth)
        self.stop = stop or threading.Event()
        self.error: BaseException | None = None

    @abstractmethod
    def handle(self, item: T) -> None: ...

    @abstractmethod
    def finish(self) -> None: ...

    @abstractmethod
    def aborted(self) -> None: ...

    def check(self) -> None:
        """Raise this thread's error in the caller's thread (the job fails, nothing is lost)."""
        if self.error is not None:
            raise self.error

    def put(self, item: T | None, poll_s: float = 0.05) -> None:
        while True:
            self.check()
            if self.stop.is_set():
                return
            if not self.is_alive():
                raise RuntimeError(f"thread {self.name} ended unexpectedly")
            try:
                self.items.put(item, timeout=poll_s)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    item = self.items.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is None:
                    self.finish()
                    return
                self.handle(item)
            self.aborted()
        except BaseException as e:  # noqa: BLE001 - forwarded to the owner, never swallowed
            self.error = e
            self.aborted()
