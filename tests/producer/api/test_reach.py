"""A size or length the model's positions cannot reach is a 400 at the gateway, naming the
field and the largest value, before anything is queued: no record, no job. The gateway reads
the folder's two configs where this host has them (no torch); without the folder it leaves the
check to the worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from producer.api.app import create_app
from producer.api.reach import folder_reach
from producer.settings import Settings
from tests.gateway import Key, write_models
from worker.generate.model.tiny import write_tiny


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reach") / "tiny-wan"
    write_tiny(folder, "t2v")
    return folder


@pytest.fixture
def client(api_settings: Settings, tiny_folder: Path, tmp_path: Path) -> Any:
    models = write_models(tmp_path / "reach-models.json", {
        "tiny": {"folder": str(tiny_folder), "size": "48x32", "seconds": "0.5", "steps": 2},
        "elsewhere": {"folder": "/no/such/folder", "size": "48x32", "seconds": "0.5"}})
    settings = api_settings.model_copy(update={"api_models_file": str(models),
                                               "api_max_body_bytes": 65536})
    with TestClient(create_app(settings)) as c:
        yield c


def native(width: int, height: int, frames: int, model: str = "tiny") -> dict[str, Any]:
    return {"job_id": "r", "generate": {"model": model, "prompt": "x", "width": width,
                                        "height": height, "num_frames": frames,
                                        "num_inference_steps": 2}}


def test_folder_reach_reads_the_configs(tiny_folder: Path) -> None:
    r = folder_reach(tiny_folder.as_uri())
    assert r is not None and (r.width, r.height, r.frames) == (512, 512, 125)
    assert folder_reach("file:///no/such/folder") is None


@pytest.mark.parametrize(("body", "param", "most"), [
    (native(528, 512, 9), "generate.width", "at most 512"),
    (native(512, 528, 9), "generate.height", "at most 512"),
    (native(48, 32, 129), "generate.num_frames", "at most 125"),
])
def test_native_jobs_beyond_the_reach_are_400(client: TestClient, keys: dict[str, Key],
                                              redis_url: str, body: dict[str, Any], param: str,
                                              most: str) -> None:
    r = client.post("/v1/jobs", json=body, headers=keys["acme"].headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value")
    assert most in error["message"] and "reach" in error["message"]
    # nothing was queued or recorded
    assert client.get("/v1/jobs/r", headers=keys["acme"].headers).status_code == 404
    assert redis.Redis.from_url(redis_url).llen("celery") == 0


@pytest.mark.parametrize(("fields", "param", "most"), [
    ({"size": "1280x720"}, "size", "width 1280 is over this model's reach: at most 512"),
    ({"size": "48x32", "seconds": "8"}, "seconds", "frames 129 is over this model's reach: "
                                                   "at most 125"),
])
def test_videos_beyond_the_reach_are_400(client: TestClient, keys: dict[str, Key],
                                         fields: dict[str, str], param: str, most: str) -> None:
    r = client.post("/v1/videos", json={"prompt": "x", "model": "tiny", **fields},
                    headers=keys["acme"].headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and most in r.json()["error"]["message"]
    assert client.get("/v1/videos", headers=keys["acme"].headers).json()["data"] == []


def test_at_the_reach_and_without_the_folder_it_is_queued(client: TestClient,
                                                          keys: dict[str, Key]) -> None:
    r = client.post("/v1/jobs", json=native(512, 512, 125), headers=keys["acme"].headers)
    assert r.status_code == 200, r.text
    # a folder this host does not have: the worker checks it
    body = {**native(528, 512, 9, "elsewhere"), "job_id": "r2"}
    r = client.post("/v1/jobs", json=body, headers=keys["acme"].headers)
    assert r.status_code == 200, r.text
