"""``/v1/files`` and ``/v1/batches`` (issue 54, point 13): a JSON Lines file in, a batch id
out, its status readable; each line submitted as its endpoint submits one request, with the
key's limits kept (a line over its jobs in flight waits); lines refused, each with its error.
In process (TestClient) on the test Redis and SeaweedFS, no worker: jobs stay queued, and a
job's end is written to the result backend as a worker writes it."""

from __future__ import annotations

import json
from typing import Any

import redis
from fastapi.testclient import TestClient
from openai.types import Batch, FileObject

from producer.api.registry import fleet_id
from producer.errors import InvalidJobError
from producer.ops.exporter import queue_depth
from producer.settings import Settings
from tests.gateway import Key


def _upload(client: TestClient, key: Key, lines: list[Any]) -> str:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines)
    r = client.post("/v1/files", headers=key.headers, data={"purpose": "batch"},
                    files={"file": ("batch.jsonl", text.encode(), "application/jsonl")})
    assert r.status_code == 200, r.text
    assert FileObject.model_validate(r.json()).purpose == "batch"  # as the openai SDK reads it
    file_id: str = r.json()["id"]
    return file_id


def _batch(client: TestClient, key: Key, file_id: str, endpoint: str) -> dict[str, Any]:
    r = client.post("/v1/batches", headers=key.headers, json={
        "input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"})
    assert r.status_code == 200, r.text
    batch: dict[str, Any] = r.json()
    assert Batch.model_validate(batch).id == batch["id"]  # as the openai SDK reads it
    return batch


def _jsonl(client: TestClient, key: Key, file_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/files/{file_id}/content", headers=key.headers)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def _video(custom_id: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/videos",
            "body": {"prompt": "a fox", "model": "tiny", **body}}


def test_a_batch_of_videos_submits_each_line_and_refuses_each_bad_one(
        client: TestClient, keys: dict[str, Key], api_settings: Settings) -> None:
    acme = keys["acme"]
    file_id = _upload(client, acme, [
        _video("a"), _video("b", seed=3), "{not json", _video("c", model="nope"),
        _video("d", steps=0), {**_video("e"), "url": "/v1/jobs"}, _video("a"),
    ])
    batch = _batch(client, acme, file_id, "/v1/videos")
    assert batch["id"].startswith("batch_") and batch["object"] == "batch"
    assert batch["status"] == "in_progress" and batch["input_file_id"] == file_id
    assert batch["request_counts"] == {"total": 7, "completed": 0, "failed": 5}
    # The submitted lines: each a video, queued as POST /v1/videos queues one
    out = _jsonl(client, acme, batch["output_file_id"])
    assert [line["custom_id"] for line in out] == ["a", "b"]
    videos = [line["response"]["body"] for line in out]
    assert all(v["object"] == "video" and v["status"] == "queued" for v in videos)
    assert queue_depth(api_settings.broker_url) == 2
    # The refused, each with the error its request would have got
    refused = _jsonl(client, acme, batch["error_file_id"])  # in the file's order
    assert [line["custom_id"] for line in refused] == ["", "c", "d", "e", ""]
    bodies = [line["response"]["body"]["error"] for line in refused]
    assert bodies[0]["code"] == "invalid_json" and bodies[0]["message"] == "line 3: not JSON"
    assert refused[1]["response"]["status_code"] == 400 and bodies[1]["code"] == "unknown_model"
    assert refused[2]["response"]["status_code"] == 400 and bodies[2]["param"] == "steps"
    assert bodies[3]["param"] == "url"
    assert bodies[4]["param"] == "custom_id" and "once in the file" in bodies[4]["message"]
    # A job of the batch ends: the counts say so, and once all have, the batch is completed
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    for v in videos:
        gw.client.app.backend.mark_as_failure(f"acme:{v['framefleet']['job_id']}",
                                              InvalidJobError("input.uri: gone"))
    done = client.get(f"/v1/batches/{batch['id']}", headers=acme.headers).json()
    assert done["status"] == "completed" and done["completed_at"] is not None
    assert done["request_counts"] == {"total": 7, "completed": 0, "failed": 7}
    # Another key sees neither the batch nor its files
    evil = keys["evil"]
    assert client.get(f"/v1/batches/{batch['id']}", headers=evil.headers).status_code == 404
    assert client.get(f"/v1/files/{file_id}/content", headers=evil.headers).status_code == 404


def test_lines_over_the_keys_jobs_in_flight_wait_for_them_to_end(
        client: TestClient, keys: dict[str, Key], api_settings: Settings) -> None:
    one = keys["one"]  # max_in_flight 1
    batch = _batch(client, one, _upload(client, one, [_video(c) for c in "xyz"]), "/v1/videos")
    assert batch["status"] == "in_progress"
    assert queue_depth(api_settings.broker_url) == 1  # the key's limit, kept
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    for queued in (1, 2, 3):
        (first,) = [line for line in _jsonl(client, one, batch["output_file_id"])
                    if line["response"]["body"]["status"] == "queued"]
        gw.client.app.backend.mark_as_failure(
            f"one:{first['response']['body']['framefleet']['job_id']}",
            InvalidJobError("input.uri: gone"))
        now = client.get(f"/v1/batches/{batch['id']}", headers=one.headers).json()
        # each read submits what the key may have in flight again: the next line
        assert now["request_counts"]["failed"] == queued
        assert queue_depth(api_settings.broker_url) == min(3, queued + 1)
    assert now["status"] == "completed"


def test_a_batch_of_native_jobs_is_the_same_jobs_when_sent_again(
        client: TestClient, keys: dict[str, Key], api_settings: Settings) -> None:
    acme = keys["acme"]
    prefix = f"{api_settings.api_input_prefix}/acme"
    lines = [{"custom_id": f"j{i}", "method": "POST", "url": "/v1/jobs", "body": {
        "job_id": f"clip-{i}", "input": {"uri": f"{prefix}/z.npy"}, "decoder": {
            "name": "pattern"}}} for i in range(3)]
    file_id = _upload(client, acme, lines)
    first = _batch(client, acme, file_id, "/v1/jobs")
    again = _batch(client, acme, file_id, "/v1/jobs")
    assert first["id"] != again["id"]
    ids = [[line["response"]["body"]["job_id"] for line in
            _jsonl(client, acme, b["output_file_id"])] for b in (first, again)]
    assert ids[0] == ids[1] == [fleet_id("acme", f"clip-{i}") for i in range(3)]
    assert queue_depth(api_settings.broker_url) == 3  # once each


def test_a_cancelled_batch_refuses_its_waiting_lines_and_cancels_its_jobs(
        client: TestClient, keys: dict[str, Key], api_settings: Settings) -> None:
    one = keys["one"]
    batch = _batch(client, one, _upload(client, one, [_video(c) for c in "pq"]), "/v1/videos")
    r = client.post(f"/v1/batches/{batch['id']}/cancel", headers=one.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    (waiting,) = _jsonl(client, one, r.json()["error_file_id"])
    assert waiting["custom_id"] == "q"
    assert waiting["response"]["body"]["error"]["code"] == "batch_cancelled"
    (queued,) = _jsonl(client, one, r.json()["output_file_id"])
    job_id = queued["response"]["body"]["framefleet"]["job_id"]
    assert redis.Redis.from_url(api_settings.broker_url).exists(f"framefleet:cancel:one:{job_id}")


def test_a_file_that_is_no_batch_makes_a_failed_batch_and_bad_requests_are_400(
        client: TestClient, keys: dict[str, Key]) -> None:
    acme = keys["acme"]
    batch = _batch(client, acme, _upload(client, acme, ["", " "]), "/v1/videos")
    assert batch["status"] == "failed" and batch["request_counts"]["total"] == 0
    assert batch["errors"]["data"][0]["message"] == "the file holds no line"
    r = client.post("/v1/batches", headers=acme.headers, json={
        "input_file_id": "file-" + "0" * 32, "endpoint": "/v1/chat", "completion_window": "24h"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "endpoint"
    r = client.post("/v1/files", headers=acme.headers, data={"purpose": "fine-tune"},
                    files={"file": ("b.jsonl", b"{}\n", "application/jsonl")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    r = client.post("/v1/files", headers=acme.headers, data={"purpose": "batch", "x": "1"},
                    files={"file": ("b.jsonl", b"{}\n", "application/jsonl")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x"  # the schema's two only
    unknown = client.post("/v1/batches", headers=acme.headers, json={
        "input_file_id": "file-" + "0" * 32, "endpoint": "/v1/videos",
        "completion_window": "24h"})
    assert unknown.status_code == 404
