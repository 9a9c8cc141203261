"""A stand-in for the EC2 instance metadata service (IMDSv2) on loopback.

Only what the spot watcher calls: ``PUT /latest/api/token`` and the token-guarded
``GET /latest/meta-data/spot/instance-action`` (404 until a notice is set). No real IMDS can
run here, so this small server is the one mock of the suite.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ImdsStandIn:
    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.notice: dict[str, Any] | None = None
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _reply(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                outer.requests.append(("PUT", self.path))
                if self.path != "/latest/api/token" or not self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    self._reply(400)
                    return
                self._reply(200, outer.token)

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") != outer.token:
                    self._reply(401)
                elif self.path != "/latest/meta-data/spot/instance-action":
                    self._reply(404)
                elif outer.notice is None:
                    self._reply(404)
                else:
                    self._reply(200, json.dumps(outer.notice))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> ImdsStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
