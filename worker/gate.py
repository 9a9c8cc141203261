"""CUDA graph captures take turns with the device work of jobs (one gate per process).

A background thread captures decode graphs (``worker.decoders.wan_graph``) while the job
thread denoises or decodes. While a capture is open, CUDA refuses every call in the process
that would wait on the capturing stream, from any thread and in ``thread_local`` capture mode
too: ``torch.cuda.synchronize()`` (a device-wide wait), cuDNN's algorithm search (it times
candidates with synchronisations; ``cudnn.benchmark`` is on for the graphs), the caching
allocator's ``cudaFree`` of cached blocks. The call fails with "operation not permitted when
stream is capturing", the capture is invalidated ("operation failed due to a previous error
during capture"), and the CUDA context of the process may be lost (seen on an H200: a 5B
denoise's eager ``conv3d`` died this way while a first-chunk graph was captured).

The job thread makes such calls at any time (diffusers, cuDNN, the allocator), so captures
are not allowed to overlap them:

- a thread that works on the device holds the gate (``work()``: a job's run, the warm-up);
- where it has queued its work and calls nothing (between denoise steps and between decoded
  chunks: ``worker.run.Run.cancelled``), it lets a waiting capture go first (``yield_point``),
  which costs one attribute read when none waits;
- a capture (``capture()``) waits until every other thread that holds the gate is parked at
  a yield point or has left, and holds everyone else back until it ends. A capture only
  records kernels: the job's queued kernels keep running on the GPU meanwhile, and a capture
  takes milliseconds to a few hundred (compiling and warming the graph happen before it, with
  the gate open).
- a thread that holds the gate and blocks on something a capture may be holding (a graph
  build) parks first (``parked()``), or the two would wait on each other.

Threads that only wait on events (the writer) or never touch CUDA (encoders, uploads) need
nothing: waiting on an event that is not part of the capture is allowed.

A second gate, ``TRACE``, of the same kind, keeps a background graph *build* (compiling,
warming and capturing a decode size) apart from code a job runs through ``torch.compile``
(the denoise's compiled transformer blocks, the warm-up's compile). While torch.compile
traces on one thread, ``torch.fx`` replaces ``torch.nn.Module.__call__`` for the whole
process: a compiled block called on another thread meanwhile raises "Detected that you are
using FX to symbolically trace a dynamo-optimized function" (seen on an H200: a denoise died
this way while a decode size compiled in the background). A denoise holds ``TRACE`` for its
whole loop and never yields it: a build waits for the denoise to end (it then overlaps the
job's decode, which runs no compiled code), and a denoise that starts during a build waits
for the build to end. Eager decoding needs neither.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CaptureGate:
    """Lets a capture run only while no other device-working thread is between yield points."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holders: dict[int, int] = {}  # thread id -> depth (``work`` nests)
        self._capturing: int | None = None  # the capturing thread
        self._waiting = 0  # captures waiting for their turn
        #: Captures that waited for a job thread to park, and the seconds they waited.
        self.waits = 0
        self.waited_s = 0.0

    @contextmanager
    def work(self) -> Iterator[None]:
        """Hold the gate while this thread works on the device."""
        me = threading.get_ident()
        with self._cond:
            if me not in self._holders:
                while self._capturing is not None and self._capturing != me:
                    self._cond.wait()
            self._holders[me] = self._holders.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._holders[me] -= 1
                if not self._holders[me]:
                    del self._holders[me]
                self._cond.notify_all()

    def yield_point(self) -> None:
        """Let waiting captures run now: call only where this thread has nothing in flight
        but queued kernels. Free when no capture waits."""
        if not self._waiting:  # read without the lock: a capture that just asked waits a poll
            return
        with self.parked():
            pass

    @contextmanager
    def parked(self) -> Iterator[None]:
        """Step out of the gate for the block (to wait on something a capture may hold); on
        the way back in, wait until no capture is waiting or open."""
        me = threading.get_ident()
        with self._cond:
            depth = self._holders.pop(me, 0)
            self._cond.notify_all()
        try:
            yield
        finally:
            if depth:
                with self._cond:
                    while self._waiting or (self._capturing is not None
                                            and self._capturing != me):
                        self._cond.wait()
                    self._holders[me] = depth

    @contextmanager
    def capture(self) -> Iterator[None]:
        """Hold everyone else back for the capture in the block."""
        import time

        me = threading.get_ident()
        t0 = time.perf_counter()
        waited = False
        with self._cond:
            self._waiting += 1
            try:
                while self._capturing is not None or any(t != me for t in self._holders):
                    waited = True
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._capturing = me
            if waited:
                self.waits += 1
                self.waited_s += time.perf_counter() - t0
        try:
            yield
        finally:
            with self._cond:
                self._capturing = None
                self._cond.notify_all()


#: The process's gate: every capture and every job of this process go through it.
GATE = CaptureGate()
#: Builds (compile, warm, capture) against code that runs compiled (see the docstring).
TRACE = CaptureGate()
