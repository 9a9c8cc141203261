"""The app factory: ``create_app(settings)`` wires the parts, the routes and the errors."""

from __future__ import annotations

from fastapi import FastAPI

from producer.api import (
    errors,
    ops,
    page,
    routes_batches,
    routes_jobs,
    routes_models,
    routes_videos,
    schema,
)
from producer.api.bodylimit import BodyLimit
from producer.api.clientlimit import ClientLimit
from producer.api.context import Gateway
from producer.api.methods import Head
from producer.client import Client
from producer.settings import Settings, get_settings

DESCRIPTION = """framefleet's HTTP gateway. `/v1/videos` speaks the OpenAI Videos API shape
(the `openai` SDK's `client.videos.*` work unmodified); `/v1/jobs` takes whole JobSpecs and
streams their events. Every route but `/`, `/healthz`, `/readyz` and `/metrics` needs
`Authorization: Bearer KEY`; the key names the tenant. Requests without a valid key are
rate-limited per client address."""


def create_app(settings: Settings | None = None, client: Client | None = None) -> FastAPI:
    """A gateway app for ``settings`` (default: the environment's); raises ``SettingsError``
    naming the variable when the keys file, the model map or the output prefix is missing."""
    settings = settings or get_settings()
    gateway = Gateway(settings, client)
    # /openapi.json is the key's own (producer.api.schema): its inputs' prefix is in it
    app = FastAPI(title="framefleet", version="1", description=DESCRIPTION, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    errors.install(app)
    # Innermost first: a HEAD finds its GET route (methods.py); the client limit's 429s are
    # counted, the body limit comes before both.
    app.add_middleware(Head, routes=app.router.routes)  # the list the routers fill below
    app.add_middleware(ClientLimit, gateway=gateway)
    ops.install_metrics(app)
    app.add_middleware(BodyLimit, max_body=settings.api_max_body_bytes,
                       max_upload=max(settings.api_max_upload_bytes + 64 * 1024,
                                      settings.api_max_body_bytes))
    app.include_router(routes_videos.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_batches.router)
    app.include_router(routes_models.router)
    app.include_router(ops.router)
    app.include_router(page.router)
    app.include_router(schema.router)
    app.openapi = lambda: schema.document(app, None)  # type: ignore[method-assign]
    return app
