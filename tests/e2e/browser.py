"""Headless Chromium driven over the DevTools protocol, as the page's tests use it: one page
target, a key pasted as a person does, the list's rows, frames on screen. Any CSP violation
from a page's first byte on is recorded (``window.cspViolations``)."""

from __future__ import annotations

import itertools
import json
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.api_fleet import wait_for
from tests.services import _Process, free_port

#: Records any CSP violation from the first byte of a page on.
CSP_PROBE = ("window.cspViolations = [];document.addEventListener('securitypolicyviolation',"
             "e => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));")


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


def open_page(browser: Browser, url: str, key: str) -> DevTools:
    """The page at ``url`` in a new tab, with ``key`` pasted as a person does."""
    page = browser.devtools()
    page.call("Page.enable")
    page.call("Page.addScriptToEvaluateOnNewDocument", source=CSP_PROBE)
    page.call("Page.navigate", url=url + "/")
    wait_for(lambda: page.eval("document.readyState") == "complete" or None, 20, "page")
    page.eval(f"document.getElementById('key').value = {json.dumps(key)};"
              "document.querySelector('#key-form button[type=submit]').click()")
    return page


def row_text(page: DevTools, job: str, timeout: float = 30, has: str = "") -> str:
    return str(wait_for(lambda: page.eval(
        f"(r => r && r.textContent.includes({json.dumps(has)}) && r.textContent)"
        f"(document.querySelector('tr[data-id=\"{job}\"]'))") or None, timeout,
        f"the job {job} in the list"))


def frames_shown(page: DevTools, job: str) -> dict[str, Any]:
    """Click the job; what the player did once it showed a few frames."""
    page.eval(f"document.querySelector('tr[data-id=\"{job}\"]').click()")
    seen = wait_for(lambda: page.eval(
        "window.framefleet.frames > 3 ? JSON.stringify(window.framefleet) : null"),
        60, "frames on screen")
    return dict(json.loads(seen))
