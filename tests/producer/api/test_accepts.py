"""The sets the OpenAPI document lists (``producer.api.accepts``) are what the gateway's checks
let through, value by value: every size of a grid, every frame count, every duration, against
the map's limits (``catalog.check_limits``) and the fleet's and the model's
(``producer.wire.fits``); then the document itself against the running routes, in process."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient

from producer.api.accepts import accepts, seconds
from producer.api.app import create_app
from producer.api.catalog import NATIVE_FIELDS, Limits, ModelEntry, check_limits, shape
from producer.api.schema import document
from producer.errors import ApiRequestError
from producer.settings import Settings
from producer.wire.fits import faults
from producer.wire.reach import Reach, reach
from producer.wire.rules import fleet_limits
from tests.gateway import Key, write_models
from tests.producer.wire.test_fits import TI2V

TINY = reach({"rope_max_seq_len": 32}, {})  # 512 px, 125 frames, multiples of 16
WAN22 = reach(*TI2V.values())  # multiples of 32
SETTINGS = Settings(max_pixels=512 * 512, max_denoise_steps=80, max_frames=161)


def _taken(entry: ModelEntry, model: Reach | None, w: int, h: int, frames: int,
           steps: int) -> bool:
    """Whether the gateway's checks let a native generate request through."""
    if not (16 <= w <= 4096 and 16 <= h <= 4096 and frames % 4 == 1):
        return False  # GenerateSpec's own bounds
    try:
        check_limits(entry, w, h, frames, steps, False, NATIVE_FIELDS, model)
    except ApiRequestError:
        return False
    return not faults(w, h, frames, steps, model, fleet_limits(SETTINGS))


@pytest.mark.parametrize(("entry", "model"), [
    (ModelEntry(folder="/m", size="64x32", seconds="1"), TINY),
    (ModelEntry(folder="/m", size="64x64", seconds="1", limits=Limits(max_pixels=100_000)),
     WAN22),
    (ModelEntry(folder="/m", size="48x32", seconds="0.5", size_multiple=16,
                limits=Limits(sizes=("48x32", "64x64", "40x40", "528x64"))), TINY),
    (ModelEntry(folder="/m", size="832x480", seconds="5", fps=24), None),
])
def test_every_size_frame_count_and_step_agrees(entry: ModelEntry, model: Reach | None) -> None:
    took = accepts(entry, model, SETTINGS)
    listed = set(took.sizes())
    for w in range(8, 1100, 8):
        for h in range(8, 1100, 8):
            assert ((w, h) in listed) == took.takes_size(w, h) == _taken(entry, model, w, h, 1,
                                                                         1), (w, h)
    w, h = next(iter(listed))
    assert [f for f in range(1, 400) if _taken(entry, model, w, h, f, 1)] == list(took.frames)
    assert [s for s in range(1, 200) if _taken(entry, model, w, h, 1, s)] == list(
        range(1, took.steps + 1))


def test_durations_are_the_frame_counts_at_the_models_rate() -> None:
    entry = ModelEntry(folder="/m", size="832x480", seconds="5", fps=24)
    took = accepts(entry, None, SETTINGS)
    durations = seconds(entry, took.frames)
    # 4k intervals at 24 fps: k/6 s, a finite decimal only every third k
    assert list(durations)[:3] == ["0.5", "1", "1.5"]
    for text, frames in durations.items():
        assert shape(entry, "64x64", text, 1).frames == frames
        assert Decimal(text) * 24 == frames - 1


@pytest.fixture
def ti2v_client(api_settings: Settings, tmp_path: Path) -> Iterator[TestClient]:
    folder = tmp_path / "ti2v"
    for name, config in TI2V.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(config))
    models = write_models(tmp_path / "m.json", {"ti2v": {
        "folder": str(folder), "size": "64x32", "seconds": "0.5", "steps": 2,
        "limits": {"max_pixels": 300_000, "max_steps": 60}}})
    settings = api_settings.model_copy(update={"api_models_file": str(models),
                                               "max_denoise_steps": 40,
                                               "api_max_in_flight": 1000})
    with TestClient(create_app(settings)) as c:
        yield c


def test_the_document_and_the_routes_agree(ti2v_client: TestClient,
                                           keys: dict[str, Key]) -> None:
    acme = keys["acme"]
    served = ti2v_client.get("/openapi.json", headers=acme.headers).json()
    assert served == document(ti2v_client.app, "acme")  # type: ignore[arg-type]
    assert ti2v_client.get("/openapi.json").json()["info"]["x-framefleet-tenant"] is None
    bodies = served["paths"]
    jobs = jsonschema_rs.validator_for(
        bodies["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"])
    videos = jsonschema_rs.validator_for(
        bodies["/v1/videos"]["post"]["requestBody"]["content"]["application/json"]["schema"])
    rng = random.Random(7)
    for i in range(60):
        w, h = rng.choice([32, 48, 64, 96, 512, 640, 1024]), rng.choice([32, 40, 64, 480, 544])
        frames, steps = rng.choice([1, 5, 9, 13, 81, 161, 165]), rng.choice([1, 2, 40, 41, 61])
        job: dict[str, Any] = {"job_id": f"agree-{i}", "generate": {
            "model": "ti2v", "prompt": "p", "width": w, "height": h, "num_frames": frames,
            "num_inference_steps": steps}}
        r = ti2v_client.post("/v1/jobs", json=job, headers=acme.headers)
        assert (r.status_code == 200) == jobs.is_valid(job), (job, r.text)
        video = {"prompt": "p", "size": f"{w}x{h}", "seconds": rng.choice(["0.25", "0.5", 5]),
                 "steps": steps}
        r = ti2v_client.post("/v1/videos", json=video, headers=acme.headers)
        assert (r.status_code == 200) == videos.is_valid(video), (video, r.text)
