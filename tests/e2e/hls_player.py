"""A real browser playing a job's live HLS stream: a loopback web server and headless Chromium.

The server serves one job's output folder (with HTTP Range requests: the playlist points
into the segment files by byte range), hls.js (the pinned npm file the package ships), and a
player page. The
page plays the playlist with hls.js, draws every presented frame to a canvas
(``requestVideoFrameCallback``), reads the pattern decoder's index cells from the pixels,
exactly as :func:`worker.decoders.pattern.read_frame_index` does, and POSTs what it saw back.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.services import REPO_ROOT, _Process
from worker.decoders.pattern import BITS, GRID_COLS, GRID_ROWS

#: The pinned npm hls.js, as the package ships it for the API's page.
HLS_JS = REPO_ROOT / "producer" / "api" / "static" / "hls.min.js"
HLS_JS_INSTALL = "hls.js, shipped in the package (producer/api/static/hls.min.js)"
CHROMIUM_INSTALL = "Debian package chromium"

PAGE = """<!doctype html>
<html><body>
<video id="v" muted playsinline></video><canvas id="c"></canvas>
<script src="/hls.min.js"></script>
<script>
const GRID_COLS = %(cols)d, GRID_ROWS = %(rows)d, BITS = %(bits)d;
const video = document.getElementById("v"), canvas = document.getElementById("c");
const ctx = canvas.getContext("2d", {willReadFrequently: true});
const seen = [], errors = [];
let reported = false;
function report(reason) {
  if (reported) return;
  reported = true;
  fetch("/report", {method: "POST", body: JSON.stringify(
    {reason, seen, errors, hls: Hls.version, ended: video.ended})});
}
function bounds(size, cells, i) { return [Math.floor(i * size / cells),
                                          Math.floor((i + 1) * size / cells)]; }
function frameIndex() {
  const w = video.videoWidth, h = video.videoHeight;
  canvas.width = w; canvas.height = h;
  ctx.drawImage(video, 0, 0, w, h);
  const px = ctx.getImageData(0, 0, w, h).data;
  let index = 0;
  for (let bit = 0; bit < BITS; bit++) {
    const row = Math.floor(bit / GRID_COLS), col = bit %% GRID_COLS;
    const [y0, y1] = bounds(h, GRID_ROWS, row), [x0, x1] = bounds(w, GRID_COLS, col);
    const dy = Math.floor((y1 - y0) / 4), dx = Math.floor((x1 - x0) / 4);
    let sum = 0, n = 0;
    for (let y = y0 + dy; y < y1 - dy; y++) {
      for (let x = x0 + dx; x < x1 - dx; x++) {
        const o = (y * w + x) * 4;
        sum += (px[o] + px[o + 1] + px[o + 2]) / 3; n++;
      }
    }
    if (sum / n > 127.5) index |= (1 << bit);
  }
  return index;
}
function dropped() { return video.getVideoPlaybackQuality().droppedVideoFrames; }
function onFrame(now, meta) {
  seen.push({index: frameIndex(), mediaTime: meta.mediaTime, presented: meta.presentedFrames,
             dropped: dropped()});
  video.requestVideoFrameCallback(onFrame);
}
video.requestVideoFrameCallback(onFrame);
// "ended" is a task of its own and may run before the rendering step that calls back for the
// last frame (a busy machine): the frame the video shows at its end is read here instead.
video.addEventListener("ended", () => {
  const last = {index: frameIndex(), mediaTime: video.currentTime, presented: null,
                dropped: dropped()};
  if (!seen.length || seen[seen.length - 1].index !== last.index) seen.push(last);
  report("ended");
});
const hls = new Hls({debug: false});
hls.on(Hls.Events.ERROR, (e, data) => {
  errors.push({type: data.type, details: data.details, fatal: data.fatal});
  if (data.fatal) report("fatal");
});
hls.on(Hls.Events.MANIFEST_PARSED, () => {
  video.playbackRate = %(rate)s;
  video.play().catch(e => { errors.push({play: String(e)}); report("play"); });
});
hls.loadSource("%(playlist)s");
hls.attachMedia(video);
</script></body></html>
"""


class PlayerServer:
    """Serves ``root`` (a job's output folder) under ``/out/``, the page and hls.js, on
    127.0.0.1; keeps the browser's report and a log of playlist fetches."""

    def __init__(self, root: Path, playlist: str, playback_rate: float = 1.0) -> None:
        self.root = root
        self.page = PAGE % {"cols": GRID_COLS, "rows": GRID_ROWS, "bits": BITS,
                            "playlist": f"/out/{playlist}", "rate": playback_rate}
        self.report: dict[str, Any] | None = None
        self.reported = threading.Event()
        #: (monotonic time, playlist text) of every playlist the browser fetched.
        self.playlist_fetches: list[tuple[float, str]] = []
        self.ranges: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def __enter__(self) -> PlayerServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str, extra: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/":
                    return self._send(200, server.page.encode(), "text/html", {})
                if path == "/hls.min.js":
                    return self._send(200, HLS_JS.read_bytes(), "text/javascript", {})
                name = path.removeprefix("/out/")
                file = server.root / name
                if not path.startswith("/out/") or "/" in name or not file.is_file():
                    return self._send(404, b"not found", "text/plain", {})
                data = file.read_bytes()
                if name.endswith(".m3u8"):
                    server.playlist_fetches.append((time.monotonic(), data.decode()))
                    return self._send(200, data, "application/vnd.apple.mpegurl", {})
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if match is None:
                    return self._send(200, data, "video/mp4", {"Accept-Ranges": "bytes"})
                start = int(match[1])
                end = int(match[2]) if match[2] else len(data) - 1
                server.ranges.append(f"{name} {start}-{end}")
                self._send(HTTPStatus.PARTIAL_CONTENT, data[start:end + 1], "video/mp4",
                           {"Content-Range": f"bytes {start}-{end}/{len(data)}"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                server.report = json.loads(body)
                server.reported.set()
                self._send(204, b"", "text/plain", {})

        return Handler


class Chromium(_Process):
    """Headless Chromium showing one page until stopped (it plays media without a gesture)."""

    def __init__(self, binary: str, workdir: Path, url: str) -> None:
        super().__init__("chromium", workdir / "chromium.log")
        self.binary, self.workdir, self.url = binary, workdir, url

    def start(self) -> None:
        argv = [
            self.binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-quic", "--autoplay-policy=no-user-gesture-required",
            # Headless tabs count as hidden: keep their timers and frames at full rate.
            "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
            "--disable-backgrounding-occluded-windows", "--window-size=800,600",
            f"--user-data-dir={self.workdir / 'profile'}", self.url,
        ]
        self._spawn(argv, {"PATH": "/usr/bin:/bin", "HOME": str(self.workdir)}, self.workdir)
