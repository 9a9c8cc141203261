"""Serve a job's files (the MP4, its segments, the live playlist, the manifest) from the
store: streamed by the gateway with HTTP Range, or as a redirect to a presigned S3 URL
(``FRAMEFLEET_API_CONTENT``).

Only the names a job writes are served, and only under the fleet's output prefix. Range: one
``bytes=`` range is honoured exactly (S3 cuts it); several ranges or a malformed header are
ignored, as RFC 9110 allows, and the whole file is sent.
"""

from __future__ import annotations

import re

from fastapi.responses import RedirectResponse, Response, StreamingResponse

from producer.api.context import Gateway
from producer.api.errors import not_found
from producer.api.registry import Record
from producer.api.store import parse, under
from producer.errors import ApiRequestError

NAME_RE = re.compile(r"^(index\.m3u8|manifest\.json|full\.mp4|segment-[0-9]{5}\.mp4)$")
TYPES = {".m3u8": "application/vnd.apple.mpegurl", ".json": "application/json",
         ".mp4": "video/mp4"}
RANGE_RE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")


def _range(header: str | None) -> str | None:
    """One ``bytes=a-b`` / ``a-`` / ``-n`` range as S3 takes it, else None (whole file)."""
    match = RANGE_RE.match((header or "").strip())
    if match is None or (not match[1] and not match[2]):
        return None
    if match[1] and match[2] and int(match[2]) < int(match[1]):
        return None  # invalid: ignored, like any other unusable Range
    return f"bytes={match[1]}-{match[2]}"


def serve(gw: Gateway, rec: Record, name: str, range_header: str | None) -> Response:
    """The file ``name`` of the job ``rec``."""
    if not NAME_RE.match(name):
        raise not_found("file")
    uri = f"{rec.output}/{name}"
    if not under(uri, gw.output_prefix):
        raise not_found("file")
    obj = parse(uri)
    live = name == "index.m3u8"
    if gw.settings.api_content == "redirect" and not live:
        return RedirectResponse(gw.store.presign(obj), status_code=307)
    byte_range = None if live else _range(range_header)
    try:
        resp, body = gw.store.get(obj, byte_range)
    except ApiRequestError as e:
        if e.status == 416:
            size = gw.store.size(obj)
            raise ApiRequestError(416, e.code, e.message,
                                  headers={"Content-Range": f"bytes */{size}"}) from None
        raise
    headers = {"Content-Length": str(resp["ContentLength"]), "Accept-Ranges": "bytes",
               "Cache-Control": "no-cache" if live else "private, max-age=3600"}
    if resp.get("ETag"):
        headers["ETag"] = resp["ETag"]
    status = 200
    if byte_range and resp.get("ContentRange"):
        status, headers["Content-Range"] = 206, resp["ContentRange"]
    return StreamingResponse(body, status, headers=headers,
                             media_type=TYPES[name[name.rindex("."):]])


def content(gw: Gateway, rec: Record, range_header: str | None) -> Response:
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
    return serve(gw, rec, "full.mp4", range_header)
