"""Playlist: a job that ends without its video ends its live HLS playlist too.

A cancelled job, or one that failed for good, would otherwise leave ``index.m3u8`` an open
EVENT playlist that players poll forever. Once the run's end is decided (so never on a retry
or a requeue: the next run goes on writing it), the listed segments stay listed and
``EXT-X-ENDLIST`` is added. Every route to a final end goes through :func:`end_playlist`:

- a run that wrote the playlist ends it at what it listed (``LivePlaylist.end_early``);
- a run that never reached the decode (the poison cap, a fatal input error, retries or the
  requeue cap spent while loading or denoising) ends the playlist an earlier run of the same
  spec left open, as stored (``hls.end_stored``). Such a run holds the job's lease, so no
  other run of the job writes the playlist meanwhile;
- ends decided without the lease (the requeue cap of lease waits, in ``worker.tasks``; Celery's
  hard time limit, in the worker's main process) and ends whose store did not answer go
  through :func:`end_later`: a thread that takes the job's lease first, then ends the
  playlist, retrying for ``END_WITHIN_S``. A run that holds the lease (a resubmitted job)
  is never touched; a playlist already ended gets no second ENDLIST.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from producer.errors import FatalJobError, RetryableError
from producer.settings import Settings
from producer.wire.spec import JobSpec
from worker.concerns.base import Concern, Outcome
from worker.concerns.lease import REDIS_DOWN, JobLease, run_lease
from worker.sinks.hls import LivePlaylist, end_stored
from worker.stores.storage import JobOutput, load_s3

log = logging.getLogger(__name__)
#: What a later attempt waits out: the store or Redis not answering.
_TRANSIENT: tuple[type[BaseException], ...] = (RetryableError, *REDIS_DOWN)

#: How long :func:`end_later` keeps trying (the lease of a dead run expires in 10 s; a store
#: outage may take minutes).
END_WITHIN_S = 300.0


def end_playlist(spec: JobSpec, settings: Settings,
                 live: LivePlaylist | None = None, lease: JobLease | None = None) -> str | None:
    """Add ``EXT-X-ENDLIST`` to the job's live playlist (``live``, the one this run wrote, if
    any; else the one stored for this spec); returns its URI, or None when there is none or
    it is ended already, or when the output is one this worker may not use (refused, so never
    written). Written under the run's ``lease`` (``worker.stores.fence``). Raises the store's
    other errors."""
    if live is not None:
        uri = live.end_early()
        if uri is not None:
            return uri
    try:
        output = JobOutput(spec.output_prefix, settings, lease)
    except FatalJobError as e:  # the refusal is the job's own error, reported already
        log.debug("job %s: no playlist to end: %s", spec.key, e)
        return None
    return end_stored(output, spec.digest())


def end_later(spec: JobSpec, settings: Settings, redis_client: Any, node: str,
              within_s: float = END_WITHIN_S) -> threading.Thread:
    """End the job's stored playlist from a thread once the job's lease is free (taken for
    the write) and the store answers; gives up after ``within_s``. Returns the thread.

    boto3 is imported first, here: from the worker's main process (the hard time limit) the
    thread would import it while Celery forks the pool process that replaces the killed one."""
    load_s3()
    thread = threading.Thread(target=_end_when_free, name=f"end-playlist-{spec.job_id}",
                              args=(spec, settings, redis_client, node, within_s), daemon=True)
    thread.start()
    return thread


def _end_when_free(spec: JobSpec, settings: Settings, redis_client: Any, node: str,
                   within_s: float) -> None:
    deadline, delay = time.monotonic() + within_s, 0.5
    while time.monotonic() < deadline:
        lease = JobLease(redis_client, spec.key, node)
        try:
            if lease.acquire():
                try:
                    _logged(spec, end_playlist(spec, settings, lease=lease), "later")
                    return
                finally:
                    lease.release()
        except _TRANSIENT as e:
            log.info("job %s: playlist not ended yet: %s", spec.key, e)
        except Exception:
            log.exception("job %s: the live playlist cannot be ended", spec.key)
            return
        time.sleep(delay)
        delay = min(2 * delay, 10.0)
    log.warning("job %s: live playlist left open: its lease or store stayed busy for %.0f s",
                spec.key, within_s)


def _logged(spec: JobSpec, uri: str | None, why: str) -> None:
    if uri is not None:
        log.info("job %s: live playlist %s ended early (%s)", spec.key, uri, why)


class EndPlaylist(Concern):
    """``EXT-X-ENDLIST`` on FAILURE or cancel: the playlist this run wrote, or else the one
    an earlier run of the spec left open."""

    def on_outcome(self, outcome: Outcome) -> None:
        if outcome.status not in ("failure", "cancelled"):
            return
        spec = self.run.spec
        try:
            _logged(spec, end_playlist(spec, self.run.settings, self.run.playlist,
                                       run_lease(self.run)), outcome.status)
        except RetryableError as e:  # the store is down: try again once it answers
            log.warning("job %s: live playlist not ended (%s); trying again", spec.key, e)
            end_later(spec, self.run.settings, getattr(self.task.app.backend, "client", None),
                      self.node)
        # Any other error is logged by run_concerns and changes nothing: the end of the job
        # is decided already.
