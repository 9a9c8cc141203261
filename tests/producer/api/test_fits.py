"""The gateway refuses a generate request that does not fit the fleet's limits or, where it has
the model's folder, the model's own, before anything is queued: a 400 naming every field at
fault (``producer.wire.fits``, the check the client and the worker make too). In process, on
the test Redis and SeaweedFS; no worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from producer.api.app import create_app
from producer.settings import Settings
from tests.gateway import Key, write_models
from tests.producer.wire.test_fits import TI2V


@pytest.fixture
def fits_client(api_settings: Settings, tmp_path: Path) -> Iterator[TestClient]:
    """A map whose model is a Wan2.2 TI2V folder (multiples of 32) while the map says 16, and
    whose step limit (400) is above the fleet's (FRAMEFLEET_MAX_DENOISE_STEPS, 100)."""
    folder = tmp_path / "ti2v"
    for name, config in TI2V.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(config))
    models = write_models(tmp_path / "fits.json", {"ti2v": {
        "folder": str(folder), "size": "64x32", "seconds": "0.5", "steps": 2,
        "limits": {"max_steps": 400}}})
    settings = api_settings.model_copy(update={"api_models_file": str(models)})
    with TestClient(create_app(settings)) as c:
        yield c


def test_a_video_names_steps_and_both_sides_of_its_size(fits_client: TestClient,
                                                        keys: dict[str, Key]) -> None:
    acme = keys["acme"].headers
    r = fits_client.post("/v1/videos", headers=acme,
                         json={"prompt": "a fox", "size": "48x48", "steps": 400})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "steps"
    assert error["message"].split("; ") == [
        "steps: 400 exceeds the limit of 100 (FRAMEFLEET_MAX_DENOISE_STEPS)",
        "size: width 48 is not a multiple of 32 (the VAE's 16 x the transformer's patch) for "
        "this model",
        "size: height 48 is not a multiple of 32 (the VAE's 16 x the transformer's patch) for "
        "this model"]
    # nothing was recorded, and what fits is taken
    assert fits_client.get("/v1/videos", headers=acme).json()["data"] == []
    ok = fits_client.post("/v1/videos", headers=acme, json={"prompt": "a fox", "size": "64x32"})
    assert ok.status_code == 200, ok.text


def test_a_native_job_names_every_generate_field(fits_client: TestClient,
                                                 keys: dict[str, Key]) -> None:
    r = fits_client.post("/v1/jobs", headers=keys["acme"].headers, json={
        "job_id": "fits-1", "generate": {"model": "ti2v", "prompt": "a fox", "width": 48,
                                         "height": 48, "num_frames": 9,
                                         "num_inference_steps": 400}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "generate.num_inference_steps"
    assert [m.split(":")[0] for m in error["message"].split("; ")] == [
        "generate.num_inference_steps", "generate.width", "generate.height"]
    assert fits_client.get("/v1/jobs/fits-1", headers=keys["acme"].headers).status_code == 404
