"""EC2 spot interruption notices (IMDSv2), polled by a small thread.

AWS posts ``latest/meta-data/spot/instance-action`` two minutes before it reclaims a spot
instance (404 until then). On a notice the worker stops taking jobs and hands its running job
back to the queue so another worker finishes it (see ``worker/concerns/cancel.py``).
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
TOKEN_TTL_S = 21_600


class ImdsClient:
    """The two IMDSv2 calls we need: a session token (PUT), then metadata reads with it."""

    def __init__(self, base_url: str, timeout_s: float = 2.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout_s
        self._token: str | None = None

    def _fetch_token(self) -> str:
        req = urllib.request.Request(
            f"{self.base}/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return str(resp.read().decode())

    def get(self, path: str) -> str | None:
        """Metadata at ``path``; None on 404. A rejected token (401) is renewed once."""
        for attempt in range(2):
            if self._token is None:
                self._token = self._fetch_token()
            req = urllib.request.Request(
                f"{self.base}/latest/meta-data/{path}",
                headers={"X-aws-ec2-metadata-token": self._token},
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return str(resp.read().decode())
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and attempt == 0:
                    self._token = None
                    continue
                raise
        return None

    def spot_action(self) -> dict[str, Any] | None:
        """The pending spot interruption (``{"action": "terminate", "time": …}``) or None."""
        body = self.get("spot/instance-action")
        if body is None:
            return None
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {"action": "unknown", "raw": body}
        return parsed if isinstance(parsed, dict) else {"action": "unknown", "raw": body}


class SpotWatcher(threading.Thread):
    """Polls for a spot notice every ``poll_s``; calls ``on_notice`` once, then stops.

    Errors reaching the metadata service are logged and retried on the next poll: a watcher
    must never take the worker down.
    """

    def __init__(self, imds_url: str, poll_s: float,
                 on_notice: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(name="framefleet-spot-watcher", daemon=True)
        self.client = ImdsClient(imds_url)
        self.poll_s = poll_s
        self.on_notice = on_notice
        self.stop_event = threading.Event()
        self.notice: dict[str, Any] | None = None

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                notice = self.client.spot_action()
            except (OSError, urllib.error.URLError) as e:
                log.debug("spot watcher: metadata service unreachable: %s", e)
                notice = None
            if notice is not None:
                self.notice = notice
                log.warning("spot interruption notice: %s", notice)
                try:
                    self.on_notice(notice)
                except Exception:
                    log.exception("spot notice handler failed")
                return
            self.stop_event.wait(self.poll_s)

    def stop(self) -> None:
        self.stop_event.set()
