"""``/``: the page to watch jobs, its script and style, and hls.js, served from here: no CDN.

hls.js is the pinned npm release (``HLS_JS_VERSION``), shipped inside the package beside the
page (``static/hls.min.js``, byte for byte the npm file, with its licence
``static/hls.js-LICENSE``), so any install of the package plays without a setting.
``FRAMEFLEET_API_HLS_JS`` serves another file instead. If the file cannot be found,
``framefleet api`` says so when it starts (:func:`hls_js`), ``/static/hls.min.js`` answers 404
with what is missing, and the page shows that instead of a player that never starts.

A strict Content-Security-Policy lets the page load nothing from elsewhere and run no inline
script; media plays from ``blob:`` (hls.js feeds Media Source Extensions). The page holds no
data: everything it shows comes from the keyed API."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Request, Response

from producer.api.errors import ApiRequestError, not_found
from producer.settings import Settings

router = APIRouter(include_in_schema=False)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "media-src 'self' blob:; img-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
STATIC = {"page.js": "text/javascript", "page.css": "text/css", "favicon.svg": "image/svg+xml"}
#: The hls.js release the package ships (npm ``hls.js``, ``dist/hls.min.js``) and its sha256.
HLS_JS_VERSION = "1.7.4"
HLS_JS_SHA256 = "cfc70cc9e9fc63d071919e087670abc760c8fd1bc889b88588026e4d22193bbe"
HLS_JS = "hls.min.js"


@dataclass(frozen=True)
class HlsJs:
    """The hls.min.js the page gets: its bytes and where they come from, or what is missing
    (``missing``: one line for the start log; ``hint``: the same without a path, for the
    page, which anyone may load)."""

    source: str
    data: bytes | None = None
    missing: str | None = None
    hint: str | None = None


def _static(name: str) -> bytes:
    return resources.files("producer.api").joinpath("static", name).read_bytes()


@lru_cache(maxsize=4)
def _find(configured: str | None) -> HlsJs:
    if configured:
        try:
            return HlsJs(f"FRAMEFLEET_API_HLS_JS={configured}", Path(configured).read_bytes())
        except OSError as e:
            return HlsJs(
                f"FRAMEFLEET_API_HLS_JS={configured}",
                missing=f"FRAMEFLEET_API_HLS_JS={configured}: {e.strerror or e}",
                hint="FRAMEFLEET_API_HLS_JS names a file the gateway cannot read")
    try:
        return HlsJs(f"hls.js {HLS_JS_VERSION}, packaged", _static(HLS_JS))
    except OSError:
        return HlsJs(
            "packaged", missing=f"the installed package has no producer/api/static/{HLS_JS} "
            f"(hls.js {HLS_JS_VERSION}); reinstall framefleet, or set FRAMEFLEET_API_HLS_JS "
            "to an hls.min.js", hint=f"the installed package has no {HLS_JS}")


def hls_js(settings: Settings) -> HlsJs:
    """The hls.min.js to serve: ``FRAMEFLEET_API_HLS_JS`` when set, else the packaged one."""
    return _find(settings.api_hls_js)


@router.get("/")
def index() -> Response:
    return Response(_static("index.html"), media_type="text/html; charset=utf-8",
                    headers=HEADERS)


@router.get("/favicon.ico")
def favicon() -> Response:
    # Browsers ask for /favicon.ico whatever the page links; an SVG answers both (a 404 here
    # filled every gateway log and the browser console with one error per page load).
    return Response(_static("favicon.svg"), media_type=STATIC["favicon.svg"], headers=HEADERS)


@router.get("/static/{name}")
def static(name: str, request: Request) -> Response:
    if name == HLS_JS:
        found = hls_js(request.app.state.gateway.settings)
        if found.data is None:
            raise ApiRequestError(
                404, "not_found", f"no hls.js: {found.hint}, so this page cannot play videos "
                "(framefleet api said so when it started)", "hls.min.js")
        return Response(found.data, media_type="text/javascript", headers=HEADERS)
    if name not in STATIC:
        raise not_found("file")
    return Response(_static(name), media_type=STATIC[name], headers=HEADERS)
