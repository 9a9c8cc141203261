"""``/``: the page to watch jobs, its script and style, and hls.js (the pinned npm file,
served from here: no CDN). A strict Content-Security-Policy lets the page load nothing from
elsewhere and run no inline script; media plays from ``blob:`` (hls.js feeds Media Source
Extensions). The page holds no data: everything it shows comes from the keyed API."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Request, Response

from producer.api.errors import not_found

router = APIRouter(include_in_schema=False)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "media-src 'self' blob:; img-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
STATIC = {"page.js": "text/javascript", "page.css": "text/css"}


def _static(name: str) -> bytes:
    return resources.files("producer.api").joinpath("static", name).read_bytes()


@router.get("/")
def index() -> Response:
    return Response(_static("index.html"), media_type="text/html; charset=utf-8",
                    headers=HEADERS)


@router.get("/static/{name}")
def static(name: str, request: Request) -> Response:
    if name == "hls.min.js":
        path = request.app.state.gateway.settings.api_hls_js
        if not path or not Path(path).is_file():
            raise not_found("file")  # FRAMEFLEET_API_HLS_JS unset: the page cannot play
        return Response(Path(path).read_bytes(), media_type="text/javascript",
                        headers=HEADERS)
    if name not in STATIC:
        raise not_found("file")
    return Response(_static(name), media_type=STATIC[name], headers=HEADERS)
