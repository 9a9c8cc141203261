"""``GET /v1/models``: the map's model names in OpenAI's list shape, with what the page's
create form needs; a key is required, as everywhere under ``/v1``."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.gateway import Key


def test_the_models_are_listed_in_the_map_s_order_with_their_defaults(
        client: TestClient, keys: dict[str, Key]) -> None:
    answer = client.get("/v1/models", headers=keys["acme"].headers)
    assert answer.status_code == 200
    body: dict[str, Any] = answer.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["tiny", "tiny-i2v"]  # the first is the default
    tiny, i2v = body["data"]
    assert (tiny["object"], tiny["owned_by"], tiny["size"], tiny["seconds"], tiny["steps"]) == (
        "model", "framefleet", "48x32", "0.5", 2)
    assert not tiny["image_to_video"] and i2v["image_to_video"]
    assert tiny["limits"]["max_steps"] >= 1
    # and no worker's folder: a client names models, never paths
    assert "folder" not in answer.text and "/" not in answer.text, answer.text


def test_the_model_list_needs_a_key(client: TestClient) -> None:
    assert client.get("/v1/models").status_code == 401
