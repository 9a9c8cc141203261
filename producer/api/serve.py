"""``framefleet api``: run the gateway under uvicorn, on ``FRAMEFLEET_API_ADDR`` (loopback
unless set) and ``FRAMEFLEET_API_PORT``.

One process per replica: the app is stateless, so replicas scale out behind a load balancer
(compose, a Kubernetes Deployment with an HPA, an AWS load balancer). uvicorn believes
``X-Forwarded-For`` only from ``FRAMEFLEET_API_TRUSTED_PROXIES`` (loopback unless set), and
takes the client as the nearest address those proxies did not add: the per-address limit
counts clients, not the load balancer, and a client cannot name itself loopback to read
``/metrics``.
"""

from __future__ import annotations

import sys

from producer.settings import Settings


def serve(settings: Settings) -> None:
    """Build the app (failing fast on a bad keys file, model map or prefix) and serve it;
    say at once when the page has no hls.js to play with (the API works without it)."""
    import uvicorn

    from producer.api.app import create_app
    from producer.api.page import hls_js

    app = create_app(settings)
    found = hls_js(settings)
    if found.missing is not None:
        sys.stderr.write(f"warning: the page at / cannot play videos: {found.missing}\n")
    uvicorn.run(app, host=str(settings.api_addr), port=settings.api_port, log_level="info",
                server_header=False, timeout_graceful_shutdown=10, proxy_headers=True,
                forwarded_allow_ips=settings.api_trusted_proxy_list)
