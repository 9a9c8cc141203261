"""Previews through ``framefleet api`` (a real uvicorn process, a real Celery worker, Redis and
SeaweedFS): the SSE stream carries ``preview`` events before the first ``segment``, the files
route serves them (and nothing beside them), they go with the job's outputs; and the page in
headless Chromium shows the newest preview in the player's place until the first segment,
then the live player."""

from __future__ import annotations

import io
import json
from typing import Any

import av
import pytest

from tests.e2e.api_fleet import ApiFleet, api_fleet, call, post_json, wait_for  # noqa: F401
from tests.e2e.test_api import events
from tests.e2e.test_api_page import Browser, open_page, row_text
from tests.require import require_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
GEN = {"prompt": "a fox", "width": 48, "height": 32, "num_frames": 9, "dtype": "float32"}


def _frames(data: bytes) -> list[Any]:
    with av.open(io.BytesIO(data)) as f:
        return [frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)]


def _job(fleet: ApiFleet, job_id: str, **generate: Any) -> dict[str, Any]:
    status, body = post_json(fleet.gateway.url, "/v1/jobs", fleet.keys["acme"],
                             {"job_id": job_id, "generate": {**GEN, **generate},
                              "video": {"segment_frames": 4}})
    assert status == 200, body
    return dict(body)


def _stored(fleet: ApiFleet, fleet_job_id: str) -> list[str]:
    listed = fleet.s3.client().list_objects_v2(Bucket=fleet.bucket,
                                               Prefix=f"out/acme/{fleet_job_id}/")
    return sorted(o["Key"].split(f"{fleet_job_id}/", 1)[1] for o in listed.get("Contents", []))


def test_sse_carries_previews_before_the_first_segment(api_fleet: ApiFleet) -> None:  # noqa: F811
    acme = api_fleet.keys["acme"]
    # Given a job whose denoise spans many of the stream's reads (the stream sends the newest
    # preview at each read: a tiny job of a few dozen steps can end between two of them)
    job = _job(api_fleet, "pv-sse", model="tiny-slow", num_inference_steps=400,
               preview={"every": 40})
    got = events(api_fleet, "pv-sse")
    kinds = [k for k, _ in got]
    assert kinds[-1] == "end" and got[-1][1]["state"] == "SUCCESS", kinds
    # Then preview events came, in step order, all before the first segment
    previews = [d for k, d in got if k == "preview"]
    steps = [p["step"] for p in previews]
    assert steps and steps == sorted(set(steps)), steps
    assert all(s == 1 or s % 40 == 0 for s in steps), steps
    assert max(i for i, k in enumerate(kinds) if k == "preview") < kinds.index("segment")
    # and each URL serves a clip of the size and frame count the event states
    for p in previews:
        assert p["url"] == f"/v1/jobs/pv-sse/files/previews/step-{p['step']:04d}.mp4"
        status, _, data = call(api_fleet.gateway.url, p["url"], acme)
        assert status == 200, data
        frames = _frames(data)
        assert len(frames) == p["frames"] == 3
        assert frames[0].shape == (p["height"], p["width"], 3) == (16, 24, 3)
    status, headers, latest = call(api_fleet.gateway.url, previews[-1]["latest_url"], acme)
    assert status == 200 and headers["Cache-Control"] == "no-cache" and len(_frames(latest)) == 3
    # Only a job's own preview names are served, and only to its tenant
    for path in ("previews/step-5.mp4", "previews/other.mp4", "previews/../manifest.json",
                 "previews/%2e%2e/manifest.json", "previews/step-0005.mp4/x", "other/latest.mp4"):
        status, _, _ = call(api_fleet.gateway.url, f"/v1/jobs/pv-sse/files/{path}", acme)
        assert status == 404, path
    status, _, _ = call(api_fleet.gateway.url, previews[0]["url"], api_fleet.keys["evil"])
    assert status == 404
    # and they go with the job's outputs
    stored = _stored(api_fleet, job["job_id"])
    assert f"previews/step-{steps[0]:04d}.mp4" in stored and "previews/latest.mp4" in stored
    status, _, body = call(api_fleet.gateway.url, "/v1/videos/pv-sse", acme, "DELETE")
    assert status == 200 and json.loads(body)["deleted"] is True, body
    assert _stored(api_fleet, job["job_id"]) == []


def test_the_page_shows_the_preview_until_the_first_segment(
        api_fleet: ApiFleet, tmp_path: Any) -> None:  # noqa: F811
    binary = require_binary("chromium", "Debian package chromium")
    acme = api_fleet.keys["acme"]
    # Given a job of the slow tiny model, a preview every 20 of its 400 steps
    _job(api_fleet, "pv-page", model="tiny-slow", num_inference_steps=400,
         preview={"every": 20})
    browser = Browser(binary, tmp_path)
    browser.start()
    try:
        page = open_page(browser, api_fleet.gateway.url, acme.secret)
        row_text(page, "pv-page")
        # When a person clicks it while it denoises
        page.eval("document.querySelector('tr[data-id=\"pv-page\"]').click()")
        shown = json.loads(wait_for(lambda: page.eval(
            "(b => !b.hidden && document.getElementById('preview').readyState >= 2 && "
            "JSON.stringify({f: window.framefleet, w: document.getElementById('preview')"
            ".videoWidth, h: document.getElementById('preview').videoHeight, "
            "video: document.getElementById('video').hidden, "
            "note: document.getElementById('preview-note').textContent}))"
            "(document.getElementById('preview-box'))") or None, 120, "a preview on the page"))
        _, _, body = call(api_fleet.gateway.url, "/v1/jobs/pv-page", acme)
        job = json.loads(body)
        # Then a preview plays in the player's place, decoded by the browser, before any segment
        assert shown["f"]["live"] is False and shown["video"] is True, shown
        assert (shown["w"], shown["h"]) == (24, 16)
        step = shown["f"]["preview"]["step"]
        assert step == 1 or step % 20 == 0, step
        assert shown["note"] == f"preview: denoise step {step}/400"
        names = [e["name"] for e in shown["f"]["events"]]
        assert "preview" in names and "hlsFragBuffered" not in names, names
        assert job["state"] != "SUCCESS", job
        # and once the first segment is in, the live player takes its place
        live = json.loads(wait_for(lambda: page.eval(
            "window.framefleet.live && window.framefleet.frames > 3 ? JSON.stringify({"
            "f: window.framefleet, box: document.getElementById('preview-box').hidden, "
            "video: document.getElementById('video').hidden}) : null") or None, 180,
            "the live player"))
        assert live["box"] is True and live["video"] is False
        names = [e["name"] for e in live["f"]["events"]]
        assert names.index("preview") < names.index("live") < len(names)
        assert names.index("hlsFragBuffered") <= names.index("live")
        assert page.eval("window.cspViolations") == []
    finally:
        browser.stop()
    wait_for(lambda: json.loads(call(api_fleet.gateway.url, "/v1/jobs/pv-page", acme)[2])[
        "state"] == "SUCCESS" or None, 120, "the job's end")


def test_the_page_shows_previews_of_a_video_with_no_setting(
        api_fleet: ApiFleet, tmp_path: Any) -> None:  # noqa: F811
    binary = require_binary("chromium", "Debian package chromium")
    acme = api_fleet.keys["acme"]
    # Given a POST /v1/videos that says nothing of previews (a worker with no preview setting)
    status, body = post_json(api_fleet.gateway.url, "/v1/videos", acme,
                             {"model": "tiny-slow", "prompt": "a fox"})
    assert status == 200, body
    video_id = body["id"]
    browser = Browser(binary, tmp_path)
    browser.start()
    try:
        page = open_page(browser, api_fleet.gateway.url, acme.secret)
        row_text(page, video_id)
        # When a person clicks it while it denoises
        page.eval(f"document.querySelector('tr[data-id=\"{video_id}\"]').click()")
        shown = json.loads(wait_for(lambda: page.eval(
            "(b => !b.hidden && document.getElementById('preview').readyState >= 2 && "
            "JSON.stringify({f: window.framefleet, "
            "w: document.getElementById('preview').videoWidth}))"
            "(document.getElementById('preview-box'))") or None, 120, "a preview on the page"))
        # Then a preview image plays, decoded by the browser, before the first segment
        assert shown["f"]["live"] is False and shown["w"] == 24, shown
        names = [e["name"] for e in shown["f"]["events"]]
        assert "preview" in names and "hlsFragBuffered" not in names, names
        step = shown["f"]["preview"]["step"]
        assert step == 1 or step % 2 == 0, step  # the default: after step 1, then every 2
    finally:
        browser.stop()
    wait_for(lambda: json.loads(call(api_fleet.gateway.url, f"/v1/videos/{video_id}", acme)[2])[
        "status"] == "completed" or None, 180, "the video's end")


def test_a_video_asks_for_previews_by_its_own_field(api_fleet: ApiFleet) -> None:  # noqa: F811
    acme = api_fleet.keys["acme"]
    # More than the steps: the preview after step 1 only (taken, as the schema says)
    status, body = post_json(api_fleet.gateway.url, "/v1/videos", acme,
                             {"model": "tiny", "prompt": "a fox", "preview": {"every": 3}})
    assert status == 200, body
    status, body = post_json(api_fleet.gateway.url, "/v1/videos", acme,
                             {"model": "tiny", "prompt": "a fox", "preview": {"every": -1}})
    assert status == 400 and body["error"]["param"] == "preview.every", body
    # off: the job stores none
    status, body = post_json(api_fleet.gateway.url, "/v1/videos", acme,
                             {"model": "tiny", "prompt": "a fox", "preview": {"every": 0}})
    assert status == 200, body
    off = body
    # and the schema says so
    _, _, schema = call(api_fleet.gateway.url, "/openapi.json")
    create = json.loads(schema)["paths"]["/v1/videos"]["post"]["requestBody"]["content"]
    for kind in ("application/json", "multipart/form-data"):
        prop = json.dumps(create[kind]["schema"]["properties"]["preview"])
        assert '"every"' in prop and "$defs" not in prop, prop
    wait_for(lambda: json.loads(call(api_fleet.gateway.url, f"/v1/videos/{off['id']}", acme)[2])[
        "status"] == "completed" or None, 120, "the video's end")
    job_id = off["framefleet"]["job_id"]
    assert not [k for k in _stored(api_fleet, job_id) if k.startswith("previews/")]
