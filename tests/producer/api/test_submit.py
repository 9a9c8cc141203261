"""What a request becomes: the spec the gateway submits, the places it decides, uploads."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from producer.api.registry import fleet_id
from producer.api.uploads import store_upload
from producer.app import QUEUE
from producer.settings import Settings
from producer.state.keys import queue_lists as queue_names
from producer.wire.spec import JobSpec
from tests.gateway import Key
from tests.producer.api.conftest import create
from tests.services import S3Server

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


def queued_spec(settings: Settings, job_id: str) -> JobSpec:
    """The spec as the client queued it (the Celery message on the test Redis)."""
    r = redis.Redis.from_url(settings.broker_url)
    for name in queue_names(QUEUE):
        for raw in r.lrange(name, 0, -1) if r.type(name) == b"list" else []:
            body = json.loads(raw)
            args = json.loads(base64.b64decode(body["body"]))[0]
            spec = JobSpec.model_validate(args[0])
            if spec.job_id == job_id:
                assert body["headers"]["id"] == spec.key  # the task id is the tenant's key
                return spec
    raise AssertionError(f"{job_id} is not queued")


def test_a_video_request_becomes_a_generate_spec_of_the_map(
        client: TestClient, keys: dict[str, Key], api_settings: Settings) -> None:
    video = create(client, keys["acme"], seconds="1", seed=7)
    job_id = video["framefleet"]["job_id"]
    assert job_id == fleet_id("acme", video["id"])
    spec = queued_spec(api_settings, job_id)
    assert spec.tenant == "acme" and spec.output.uri == api_settings.output_prefix
    gen = spec.generate
    assert gen is not None
    assert (gen.model, gen.width, gen.height, gen.num_frames) == ("file:///models/tiny", 48,
                                                                  32, 17)
    assert (gen.num_inference_steps, gen.seed, spec.video.stitch) == (2, 7, True)
    assert video["seconds"] == "1" and video["size"] == "48x32"


def test_two_tenants_with_one_id_are_two_jobs(client: TestClient,
                                             keys: dict[str, Key]) -> None:
    spec = {"job_id": "same", "input": {"uri": "s3://x/y.npy"}, "decoder": {"name": "pattern"}}
    ids = []
    for tenant in ("acme", "evil"):
        body = {**spec, "input": {"uri": client.app.state.gateway.settings  # type: ignore
                                  .api_input_prefix + f"/{tenant}/z.npy"}}
        r = client.post("/v1/jobs", json=body, headers=keys[tenant].headers)
        assert r.status_code == 200, r.text
        ids.append(r.json()["job_id"])
    assert ids[0] != ids[1]
    assert ids == [fleet_id("acme", "same"), fleet_id("evil", "same")]


@pytest.mark.parametrize(("change", "param"), [
    ({"tenant": "evil"}, "tenant"),
    ({"output": {"uri": "s3://elsewhere/out"}}, "output"),
    ({"input": {"uri": "file:///etc/passwd.npy"}}, "input.uri"),
    ({"input": {"uri": "s3://other-bucket/acme/z.npy"}}, "input.uri"),
    ({"input": {"uri": "IN/evil/z.npy"}}, "input.uri"),
    ({"input": {"uri": "IN/acme/../evil/z.npy"}}, "input.uri"),
    ({"input": {"uri": "IN/acme/%2e%2e/evil/z.npy"}}, "input.uri"),
    ({"decoder": {"name": "wan2.1-vae", "weights": "file:///models/x"}}, "decoder.weights"),
    ({"job_id": "../x"}, "job_id"),
    ({"job_id": None}, "job_id"),
    ({"priority": 12}, "priority"),
    ({"time_limit_s": 10**9}, "time_limit_s"),
])
def test_a_native_spec_cannot_name_places(client: TestClient, keys: dict[str, Key],
                                          api_settings: Settings, change: dict[str, Any],
                                          param: str) -> None:
    prefix = str(api_settings.api_input_prefix)
    body = {"job_id": "j1", "input": {"uri": f"{prefix}/acme/z.npy"},
            "decoder": {"name": "pattern"}, **change}
    if "input" in change:
        body["input"] = {"uri": change["input"]["uri"].replace("IN", prefix)}
    r = client.post("/v1/jobs", json=body, headers=keys["acme"].headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_a_native_generate_names_a_model_of_the_map(
        client: TestClient, keys: dict[str, Key], api_settings: Settings) -> None:
    gen = {"prompt": "p", "height": 32, "width": 48, "num_frames": 9, "num_inference_steps": 2}
    r = client.post("/v1/jobs", json={"job_id": "g1", "generate": {**gen, "model": "nope"}},
                    headers=keys["acme"].headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "generate.model"
    r = client.post("/v1/jobs", json={"job_id": "g1", "generate": {
        **gen, "model": "file:///models/tiny"}}, headers=keys["acme"].headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "generate.model"
    r = client.post("/v1/jobs", json={"job_id": "g1", "generate": {**gen, "model": "tiny"}},
                    headers=keys["acme"].headers)
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["state"] == "QUEUED" and job["object"] == "framefleet.job"
    spec = queued_spec(api_settings, job["job_id"])
    assert spec.generate is not None and spec.generate.model == "file:///models/tiny"
    # The video object names the model, never its folder.
    assert client.get("/v1/videos/g1", headers=keys["acme"].headers).json()["model"] == "tiny"


def test_an_upload_lands_under_the_tenants_input_prefix(
        api_settings: Settings, s3: S3Server, client: TestClient) -> None:
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    uri = store_upload(gw.store, api_settings, "acme", "video_1", PNG)
    assert uri == f"{api_settings.api_input_prefix}/acme/video_1/input_reference.png"
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    got = s3.client().get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == PNG and got["ContentType"] == "image/png"


def test_input_reference_is_checked_then_meets_the_image_to_video_seam(
        client: TestClient, keys: dict[str, Key], api_settings: Settings,
        s3: S3Server) -> None:
    h = keys["acme"].headers

    def post(model: str, data: bytes) -> Any:
        return client.post("/v1/videos", data={"prompt": "p", "model": model},
                           files={"input_reference": ("x.png", data, "image/png")}, headers=h)

    r = post("tiny", PNG)  # a text-to-video model
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_reference"
    r = post("tiny-i2v", b"GIF89a not an image we take")  # named .png, not one by content
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
    r = post("tiny-i2v", PNG)
    bucket = str(api_settings.api_input_prefix).removeprefix("s3://").split("/")[0]
    left = s3.client().list_objects_v2(Bucket=bucket, Prefix="in/").get("Contents", [])
    if "image" in JobSpec.model_fields["generate"].annotation.__args__[0].model_fields:  # type: ignore[union-attr]
        assert r.status_code == 200, r.text  # image-to-video has landed
        assert [o["Key"] for o in left] == [f"in/acme/{r.json()['id']}/input_reference.png"]
        listed = client.get("/v1/videos", headers=h).json()["data"]
        assert [v["id"] for v in listed] == [r.json()["id"]]  # only the accepted one
    else:
        # Until generate.image exists the request is refused, naming the field, and the
        # upload it stored is removed again.
        assert r.status_code == 501 and r.json()["error"]["param"] == "input_reference"
        assert left == []
        assert client.get("/v1/videos", headers=h).json()["data"] == []
