"""The page at ``/`` in headless Chromium, driven over the DevTools protocol like a person:
paste a key, see the jobs, click one that is still rendering and watch it play with hls.js
(its events read from the page), all under the page's strict Content-Security-Policy."""

from __future__ import annotations

import itertools
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.api_fleet import ApiFleet, api_fleet, wait_for  # noqa: F401 - the fixture
from tests.gateway import HLS_JS
from tests.require import missing, require_binary
from tests.services import _Process, free_port

pytestmark = pytest.mark.e2e
JOB = "page-1"


class DevTools:
    """One page target of a Chromium, over its DevTools websocket."""

    def __init__(self, port: int) -> None:
        import websocket

        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json",
                                                    timeout=5).read())
        (page,) = [t for t in targets if t["type"] == "page"][:1]
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=10,
                                              suppress_origin=True)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> Any:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == n:
                assert "error" not in msg, msg
                return msg.get("result")

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")


class Browser(_Process):
    def __init__(self, binary: str, workdir: Path) -> None:
        super().__init__("chromium", workdir / "chromium.log")
        self.binary, self.workdir, self.port = binary, workdir, free_port()

    def start(self) -> None:
        self._spawn([
            self.binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-quic", "--autoplay-policy=no-user-gesture-required",
            "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
            "--remote-allow-origins=*", f"--remote-debugging-port={self.port}",
            "--remote-debugging-address=127.0.0.1", f"--user-data-dir={self.workdir / 'p'}",
            "about:blank"], {"PATH": "/usr/bin:/bin", "HOME": str(self.workdir)}, self.workdir)

    def devtools(self) -> DevTools:
        def up() -> DevTools | None:
            try:
                return DevTools(self.port)
            except OSError:
                return None
        return wait_for(up, 30, "DevTools endpoint")  # type: ignore[no-any-return]


def job_state(fleet: ApiFleet) -> str:
    req = urllib.request.Request(fleet.gateway.url + f"/v1/jobs/{JOB}",
                                 headers=fleet.keys["acme"].headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(json.loads(r.read())["state"])


def test_the_page_lists_jobs_and_plays_one_still_running(api_fleet: ApiFleet,  # noqa: F811
                                                         tmp_path: Path) -> None:
    binary = require_binary("chromium", "Debian package chromium")
    if not HLS_JS.is_file():
        missing("hls.js", "scripts/install-system-deps.sh (npm install into .node/)")
    # Given a job that renders for ~10 s, its first segment 4 frames long
    uri = api_fleet.put_latents("acme", JOB, latent_frames=60, h=24, w=32)
    spec = api_fleet.pattern_job(JOB, uri, segment_frames=16, first_segment_frames=4)
    req = urllib.request.Request(api_fleet.gateway.url + "/v1/jobs", method="POST",
                                 data=json.dumps(spec).encode(),
                                 headers={**api_fleet.keys["acme"].headers,
                                          "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).read()
    browser = Browser(binary, tmp_path)
    browser.start()
    try:
        page = browser.devtools()
        page.call("Page.enable")
        # Record any CSP violation from the first byte of the page on.
        page.call("Page.addScriptToEvaluateOnNewDocument", source=(
            "window.cspViolations = [];document.addEventListener('securitypolicyviolation',"
            "e => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));"))
        page.call("Page.navigate", url=api_fleet.gateway.url + "/")
        wait_for(lambda: page.eval("document.readyState") == "complete" or None, 20, "page")
        # When a person pastes the key
        key = api_fleet.keys["acme"].secret
        page.eval(f"document.getElementById('key').value = {json.dumps(key)};"
                  "document.querySelector('#key-form button[type=submit]').click()")
        row = wait_for(lambda: page.eval(
            f"(r => r && r.textContent)(document.querySelector('tr[data-id=\"{JOB}\"]'))"),
            30, "the job in the list")
        assert key not in page.eval("document.documentElement.outerHTML")
        assert page.eval("sessionStorage.getItem('framefleet.key')") == key
        assert page.eval("localStorage.length") == 0
        wait_for(lambda: job_state(api_fleet) == "PROGRESS" or None, 60, "rendering")
        # and clicks the job while it still renders
        page.eval(f"document.querySelector('tr[data-id=\"{JOB}\"]').click()")
        seen = wait_for(lambda: page.eval(
            "window.framefleet.frames > 3 ? JSON.stringify(window.framefleet) : null"),
            60, "frames on screen")
        running = job_state(api_fleet)
        state = json.loads(seen)
        names = [e["name"] for e in state["events"]]
        # Then hls.js loaded the live playlist and buffered fragments, and frames showed,
        assert "hlsManifestParsed" in names and "hlsFragBuffered" in names, names
        levels = [e["detail"] for e in state["events"] if e["name"] == "hlsLevelLoaded"]
        assert levels and levels[0]["live"] is True  # no ENDLIST yet: a live stream
        assert running != "SUCCESS", "the job ended before the player showed a frame"
        # the list showed its state and progress, and nothing broke the CSP
        assert JOB in row and "%" in row
        assert page.eval("window.cspViolations") == []
        # A click before the first segment is listed meets no playlist yet: the page looks
        # again. That is the only fatal error allowed, and only before the stream opened.
        fatal = [i for i, e in enumerate(state["events"])
                 if e["name"] == "hlsError" and e["detail"]["fatal"]]
        assert all(state["events"][i]["detail"]["details"] == "manifestLoadError"
                   for i in fatal), state["events"]
        assert not fatal or max(fatal) < names.index("hlsManifestParsed"), names
        shot = page.call("Page.captureScreenshot")["data"]
        (tmp_path / "page.png").write_bytes(__import__("base64").b64decode(shot))
    finally:
        browser.stop()
    wait_for(lambda: job_state(api_fleet) == "SUCCESS" or None, 60, "the job's end")
