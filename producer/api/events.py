"""``GET /v1/jobs/{id}/events``: the job's Server-Sent Events, until its final state.

Events, each with a rising ``id``:

- ``state``: the native job object, whenever the state or the progress changed;
- ``preview``: ``{step, steps_total, url, latest_url, width, height, frames, fps}`` for the
  newest preview of a generate job, each step once, in step order (a preview replaced between
  two reads is not sent), until the first segment: previews stand in for the video until then;
- ``segment``: ``{index, url}`` for each segment that joined the live playlist (counted by
  the worker's progress; the manifest's segments on success), in order, each once;
- ``end``: the final job object (SUCCESS, FAILURE or REVOKED); then the stream closes.

The state is read every ``FRAMEFLEET_API_EVENTS_POLL_S`` in a worker thread (the client is
blocking), so an open stream holds no thread between reads. A comment line every
``KEEPALIVE_S`` keeps proxies from closing a quiet stream. Each stream holds one of its
tenant's stream slots (``producer.api.streams``), renewed while it runs.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi.sse import ServerSentEvent

from producer.api.context import Gateway
from producer.api.registry import Record
from producer.api.streams import RENEW_S, Slot
from producer.api.video import job_object
from producer.wire.spec import PREVIEW_LATEST, PreviewInfo, preview_name, segment_name

KEEPALIVE_S = 15.0


def preview_data(rec: Record, p: PreviewInfo) -> dict[str, Any]:
    """A ``preview`` event: the preview's step, size and its files under the job's URL."""
    files = f"/v1/jobs/{rec.id}/files"
    return {"step": p.step, "steps_total": p.steps_total, "url": f"{files}/{preview_name(p.step)}",
            "latest_url": f"{files}/{PREVIEW_LATEST}", "width": p.width, "height": p.height,
            "frames": p.frames, "fps": p.fps}


async def job_events(gw: Gateway, rec: Record, slot: Slot) -> AsyncIterator[ServerSentEvent]:
    """The events of ``rec``'s job, holding ``slot`` (renewed) while the stream is open."""
    seq, sent_segments, sent_preview, last_key = 0, 0, 0, None
    quiet_since = renewed = time.monotonic()

    def event(kind: str, data: Any) -> ServerSentEvent:
        nonlocal seq, quiet_since
        seq += 1
        quiet_since = time.monotonic()
        return ServerSentEvent(event=kind, data=data, id=str(seq))

    def segments(upto: int) -> list[ServerSentEvent]:
        nonlocal sent_segments
        out = []
        for index in range(sent_segments, upto):
            url = f"/v1/jobs/{rec.id}/files/{segment_name(index)}"
            out.append(event("segment", {"index": index, "url": url}))
        sent_segments = max(sent_segments, upto)
        return out

    while True:
        view = await anyio.to_thread.run_sync(gw.view, rec)
        js = view.state
        obj = job_object(view)
        key = (js.state, obj["percent"], obj["progress"])
        if key != last_key:
            last_key = key
            yield event("state", obj)
        if js.progress is not None:
            shown = js.progress.preview
            # previews stand in for the video until its first segment: none after it
            if (shown is not None and shown.step > sent_preview and not sent_segments
                    and not js.progress.segments_done):
                sent_preview = shown.step
                yield event("preview", preview_data(rec, shown))
            for e in segments(js.progress.segments_done):
                yield e
        if js.finished:
            if view.result is not None:
                for e in segments(len(view.result.manifest.segments)):
                    yield e
            yield event("end", obj)
            return
        if time.monotonic() - renewed > RENEW_S:
            renewed = time.monotonic()
            await anyio.to_thread.run_sync(slot.renew)
        if time.monotonic() - quiet_since > KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ServerSentEvent(comment="keep-alive")
        await anyio.sleep(gw.settings.api_events_poll_s)
