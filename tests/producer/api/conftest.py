"""The gateway in process (FastAPI's TestClient) on the test Redis and SeaweedFS: no worker,
so jobs stay queued. The end-to-end tests (tests/e2e/test_api*.py) run it as a real uvicorn
process with a real worker."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from producer.api.app import create_app
from producer.settings import Settings
from tests.gateway import HLS_JS, Key, write_keys, write_models
from tests.services import S3Server

MODELS = {
    "tiny": {"folder": "/models/tiny", "size": "48x32", "seconds": "0.5", "steps": 2},
    "tiny-i2v": {"folder": "/models/tiny-i2v", "size": "48x32", "seconds": "0.5",
                 "image_to_video": True},
}


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Key]:
    return write_keys(tmp_path / "keys.toml", {
        "acme": {"delete_outputs": True}, "evil": {},
        "slow": {"rate_per_minute": 3}, "one": {"max_in_flight": 1},
    })


@pytest.fixture
def api_settings(tmp_path: Path, keys: dict[str, Key], redis_url: str, s3: S3Server,
                 monkeypatch: pytest.MonkeyPatch) -> Settings:
    bucket = f"ff-api-{secrets.token_hex(4)}"
    s3.client().create_bucket(Bucket=bucket)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    redis.Redis.from_url(redis_url).flushdb()
    return Settings(
        broker_url=redis_url, result_backend=redis_url, s3_endpoint_url=s3.endpoint_url,
        s3_region=s3.region, output_prefix=f"s3://{bucket}/out",
        api_input_prefix=f"s3://{bucket}/in", api_keys_file=str(tmp_path / "keys.toml"),
        api_models_file=str(write_models(tmp_path / "models.json", MODELS)),
        api_max_body_bytes=4096, api_max_upload_bytes=8192, api_hls_js=str(HLS_JS),
    )


@pytest.fixture
def client(api_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(api_settings)) as c:
        yield c


def create(client: TestClient, key: Key, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/videos", json={"prompt": "a fox", "model": "tiny", **body},
                    headers=key.headers)
    assert r.status_code == 200, r.text
    video: dict[str, Any] = r.json()
    return video
