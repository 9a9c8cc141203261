"""Playlist: a job that ends without its video ends its live HLS playlist too.

A cancelled job, or one that failed for good, would otherwise leave ``index.m3u8`` an open
EVENT playlist that players poll forever. Once the run's end is decided (so never on a retry
or a requeue: the next run goes on writing it), the segments this run listed stay listed and
``EXT-X-ENDLIST`` is added (``LivePlaylist.end_early``). Only the playlist this run created
is touched: a run that never reached the decode (a lease held elsewhere, a refused spec)
cannot end a playlist another run of the job is writing.
"""

from __future__ import annotations

import logging

from worker.concerns.base import Concern, Outcome

log = logging.getLogger(__name__)


class EndPlaylist(Concern):
    """``EXT-X-ENDLIST`` on FAILURE or cancel, for the playlist this run wrote."""

    def on_outcome(self, outcome: Outcome) -> None:
        playlist = self.run.playlist
        if outcome.status not in ("failure", "cancelled") or playlist is None:
            return
        # An error here (S3 down) is logged by run_concerns and changes nothing: the end of
        # the job is decided already.
        uri = playlist.end_early()
        if uri is not None:
            log.info("job %s: live playlist %s ended early (%s)", self.run.spec.key, uri,
                     outcome.status)
