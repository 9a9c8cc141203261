"""Serve a job's files (the MP4, its segments, the live playlist, the manifest, the previews)
from the store: streamed by the gateway with HTTP Range, or as a redirect to a presigned S3 URL
(``FRAMEFLEET_API_CONTENT``). HEAD answers the same status and headers as GET, without a body.

Only the names a job writes are served, and only under the fleet's output prefix. Range
(RFC 9110, section 14): one ``bytes=`` range is served exactly, its end clamped to the object's
last byte (``bytes=0-9999999999999999999`` is the whole object, as a 206), a range that starts
past the end is a 416 with ``Content-Range: bytes */SIZE``; several ranges, a malformed header
or an end before its start are ignored, as the RFC allows, and the whole file is sent. The
gateway works the range out against the object's size and asks the store for exactly those
bytes: stores differ on ends past the object (SeaweedFS refused a 20-digit one).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import RedirectResponse, Response, StreamingResponse

from producer.api.context import Gateway
from producer.api.errors import not_found
from producer.api.registry import Record
from producer.api.store import Obj, parse, under
from producer.errors import ApiRequestError
from producer.wire.spec import PREVIEW_LATEST

NAME_RE = re.compile(r"^(index\.m3u8|manifest\.json|full\.mp4|segment-[0-9]{5}\.mp4|"
                     r"previews/(latest|step-[0-9]{4,5})\.mp4)$")
#: Files a job replaces while it runs: never cached, never redirected to a presigned URL.
LIVE = {"index.m3u8", PREVIEW_LATEST}
TYPES = {".m3u8": "application/vnd.apple.mpegurl", ".json": "application/json",
         ".mp4": "video/mp4"}
# Any number of digits is a valid position; past 100 the header is not a client's mistake.
RANGE_RE = re.compile(r"^bytes=([0-9]{0,100})-([0-9]{0,100})$")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The first and last byte of the one range ``header`` asks for, clamped to an object of
    ``size`` bytes; None for the whole object (no range, or one that is ignored). An
    unsatisfiable range is a 416."""
    match = RANGE_RE.match((header or "").strip())
    if match is None or (not match[1] and not match[2]):
        return None
    if match[1]:
        first = int(match[1])
        if match[2] and int(match[2]) < first:
            return None  # invalid: ignored, like any other unusable Range
        if first >= size:
            raise _unsatisfiable(size)
        return first, min(int(match[2]) if match[2] else size - 1, size - 1)
    suffix = int(match[2])  # bytes=-N: the last N bytes
    if suffix == 0 or size == 0:
        raise _unsatisfiable(size)
    return max(0, size - suffix), size - 1


def _unsatisfiable(size: int) -> ApiRequestError:
    return ApiRequestError(416, "range_not_satisfiable", "range not satisfiable",
                           headers={"Content-Range": f"bytes */{size}"})


def _headers(info: dict[str, Any], live: bool) -> dict[str, str]:
    headers = {"Content-Length": str(info["ContentLength"]), "Accept-Ranges": "bytes",
               "Cache-Control": "no-cache" if live else "private, max-age=3600"}
    if info.get("ETag"):
        headers["ETag"] = info["ETag"]
    return headers


def _ranged(gw: Gateway, obj: Obj, header: str, head: bool,
            media_type: str) -> Response | None:
    """A 206 for the range ``header`` asks for (None: it is ignored: serve the whole)."""
    info = gw.store.head(obj)
    size = int(info["ContentLength"])
    span = byte_range(header, size)
    if span is None:
        return None
    first, last = span
    headers = {**_headers({**info, "ContentLength": last - first + 1}, False),
               "Content-Range": f"bytes {first}-{last}/{size}"}
    if head:
        return Response(None, 206, headers=headers, media_type=media_type)
    _, body = gw.store.get(obj, f"bytes={first}-{last}")
    return StreamingResponse(body, 206, headers=headers, media_type=media_type)


def serve(gw: Gateway, rec: Record, name: str, range_header: str | None,
          head: bool = False) -> Response:
    """The file ``name`` of the job ``rec`` (``head``: its status and headers only)."""
    if not NAME_RE.match(name):
        raise not_found("file")
    uri = f"{rec.output}/{name}"
    if not under(uri, gw.output_prefix):
        raise not_found("file")
    obj = parse(uri)
    live = name in LIVE
    media_type = TYPES[name[name.rindex("."):]]
    if gw.settings.api_content == "redirect" and not live:
        return RedirectResponse(gw.store.presign(obj), status_code=307)
    if range_header and not live:
        ranged = _ranged(gw, obj, range_header, head, media_type)
        if ranged is not None:
            return ranged
    if head:
        return Response(None, 200, headers=_headers(gw.store.head(obj), live),
                        media_type=media_type)
    resp, body = gw.store.get(obj)
    return StreamingResponse(body, 200, headers=_headers(resp, live), media_type=media_type)


def content(gw: Gateway, rec: Record, range_header: str | None, head: bool = False) -> Response:
    """``/v1/videos/{id}/content``: ``full.mp4``, once the job has finished with one."""
    view = gw.view(rec)
    if view.state.state != "SUCCESS":
        raise ApiRequestError(404, "video_not_ready",
                              f"the video is {view.status}: its content comes once completed")
    assert view.result is not None
    full = view.result.manifest.full_uri
    if full is None or full != f"{rec.output}/full.mp4":
        raise ApiRequestError(404, "no_full_video", "this job wrote no full.mp4 (a native job "
                              "asks for one with video.stitch); its segments are under files/")
    return serve(gw, rec, "full.mp4", range_header, head)
