"""The page at ``/`` in headless Chromium, driven over the DevTools protocol like a person
(``tests/e2e/browser.py``): paste a key, see the jobs, click one that is still rendering and
watch it play with hls.js (its events read from the page); make a video with the create form
and see its previews, then the video; all under the page's strict Content-Security-Policy.

hls.js is the one the package ships: the fleet's gateway has no setting for it, a gateway run
from a fresh install of the built wheel serves it too, and one whose hls.js is missing says so
at start and on the page."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from producer.api.page import HLS_JS_SHA256
from tests.e2e.api_fleet import ApiFleet, api_fleet, wait_for  # noqa: F401 - the fixture
from tests.e2e.browser import Browser, DevTools, frames_shown, open_page, row_text
from tests.gateway import GatewayProcess
from tests.require import require_binary
from tests.wheel import build_wheel, install_fresh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
JOB = "page-1"


def http(url: str, headers: dict[str, str] | None = None, data: Any = None,
         ) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={**(headers or {}), **(
        {"Content-Type": "application/json"} if data is not None else {})},
        data=json.dumps(data).encode() if data is not None else None,
        method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def job_state(fleet: ApiFleet, job: str = JOB, tenant: str = "acme") -> str:
    _, body = http(fleet.gateway.url + f"/v1/jobs/{job}", fleet.keys[tenant].headers)
    return str(json.loads(body).get("state", body))


def test_the_page_lists_jobs_and_plays_one_still_running(api_fleet: ApiFleet,  # noqa: F811
                                                         tmp_path: Path) -> None:
    binary = require_binary("chromium", "Debian package chromium")
    # Given a job that renders for ~10 s, its first segment 4 frames long
    uri = api_fleet.put_latents("acme", JOB, latent_frames=60, h=24, w=32)
    spec = api_fleet.pattern_job(JOB, uri, segment_frames=16, first_segment_frames=4)
    http(api_fleet.gateway.url + "/v1/jobs", api_fleet.keys["acme"].headers, spec)
    browser = Browser(binary, tmp_path)
    browser.start()
    try:
        # When a person pastes the key (the gateway has no hls.js setting: the packaged one)
        key = api_fleet.keys["acme"].secret
        page = open_page(browser, api_fleet.gateway.url, key)
        row = row_text(page, JOB)
        assert key not in page.eval("document.documentElement.outerHTML")
        assert page.eval("sessionStorage.getItem('framefleet.key')") == key
        assert page.eval("localStorage.length") == 0
        wait_for(lambda: job_state(api_fleet) == "PROGRESS" or None, 60, "rendering")
        # and clicks the job while it still renders
        state = frames_shown(page, JOB)
        running = job_state(api_fleet)
        names = [e["name"] for e in state["events"]]
        # Then hls.js loaded the live playlist and buffered fragments, and frames showed,
        assert "hlsManifestParsed" in names and "hlsFragBuffered" in names, names
        levels = [e["detail"] for e in state["events"] if e["name"] == "hlsLevelLoaded"]
        assert levels and levels[0]["live"] is True  # no ENDLIST yet: a live stream
        assert running != "SUCCESS", "the job ended before the player showed a frame"
        # the list showed its state and progress, and nothing broke the CSP
        assert JOB in row and "%" in row
        assert page.eval("window.cspViolations") == []
        # A click before the first segment is listed meets no playlist yet: the page looks
        # again. That is the only fatal error allowed, and only before the stream opened.
        fatal = [i for i, e in enumerate(state["events"])
                 if e["name"] == "hlsError" and e["detail"]["fatal"]]
        assert all(state["events"][i]["detail"]["details"] == "manifestLoadError"
                   for i in fatal), state["events"]
        assert not fatal or max(fatal) < names.index("hlsManifestParsed"), names
        shot = page.call("Page.captureScreenshot")["data"]
        (tmp_path / "page.png").write_bytes(base64.b64decode(shot))
    finally:
        browser.stop()
    wait_for(lambda: job_state(api_fleet) == "SUCCESS" or None, 60, "the job's end")


def _gateway_env(fleet: ApiFleet, **extra: str) -> dict[str, str]:
    """The fleet gateway's own settings (keys, models, Redis, S3), nothing else of ours."""
    return {**{k: v for k, v in fleet.gateway.env.items()
               if k.startswith(("FRAMEFLEET_", "AWS_")) and k != "FRAMEFLEET_API_PORT"},
            **extra}


def test_a_fresh_install_serves_hls_js_and_the_page_plays_a_job(api_fleet: ApiFleet,  # noqa: F811
                                                               tmp_path: Path) -> None:
    binary = require_binary("chromium", "Debian package chromium")
    # Given the package as pip builds it, installed into a folder of its own
    wheel, _ = build_wheel(tmp_path / "build")
    site = install_fresh(wheel, tmp_path / "site")
    run = tmp_path / "run"  # not the checkout: what runs is the installed package
    run.mkdir()
    env = _gateway_env(api_fleet, PYTHONPATH=str(site))
    where = subprocess.run(
        [sys.executable, "-c", "import producer.api.page as p; print(p.__file__)"],
        env={**env, "PATH": "/usr/bin:/bin"}, cwd=run, capture_output=True, text=True)
    assert where.stdout.startswith(str(site)), where
    # and a gateway run from it with no setting for hls.js
    assert "FRAMEFLEET_API_HLS_JS" not in env
    gateway = GatewayProcess(tmp_path, env, name="fresh", cwd=run)
    gateway.start()
    try:
        # Then it serves the pinned hls.js (was a 404 without FRAMEFLEET_API_HLS_JS)
        status, body = http(gateway.url + "/static/hls.min.js")
        assert status == 200 and hashlib.sha256(body).hexdigest() == HLS_JS_SHA256
        assert "cannot play" not in gateway.log_text()
        # and a person plays a finished prompt job of the tiny model, labelled as noise
        acme = api_fleet.keys["acme"]
        status, body = http(gateway.url + "/v1/videos", acme.headers,
                            {"model": "tiny", "prompt": "a red fox", "seconds": "0.5"})
        assert status == 200, body
        video = json.loads(body)["id"]
        wait_for(lambda: job_state(api_fleet, video) == "SUCCESS" or None, 180, "its end")
        browser = Browser(binary, tmp_path)
        browser.start()
        try:
            page = open_page(browser, gateway.url, acme.secret)
            row = row_text(page, video, has="random weights")
            assert "completed (SUCCESS), random weights: noise" in row, row
            state = frames_shown(page, video)
            names = [e["name"] for e in state["events"]]
            assert "hlsManifestParsed" in names and "hlsFragBuffered" in names, names
            assert page.eval("document.getElementById('note').textContent") == \
                "random weights: noise"
            assert page.eval("window.cspViolations") == []
            assert page.eval("document.getElementById('missing').hidden") is True
        finally:
            browser.stop()
    finally:
        gateway.stop()


def test_a_gateway_without_hls_js_says_so_at_start_and_on_the_page(
        api_fleet: ApiFleet, tmp_path: Path) -> None:  # noqa: F811
    binary = require_binary("chromium", "Debian package chromium")
    job = "page-2"
    uri = api_fleet.put_latents("acme", job, latent_frames=2)
    http(api_fleet.gateway.url + "/v1/jobs", api_fleet.keys["acme"].headers,
         api_fleet.pattern_job(job, uri))
    nowhere = tmp_path / "no" / "hls.min.js"
    gateway = GatewayProcess(tmp_path, _gateway_env(
        api_fleet, FRAMEFLEET_API_HLS_JS=str(nowhere)), name="no-hls")
    gateway.start()
    try:
        # framefleet api says so when it starts, naming the file
        assert (f"warning: the page at / cannot play videos: FRAMEFLEET_API_HLS_JS={nowhere}: "
                "No such file or directory") in gateway.log_text()
        # the file is a 404 that says what is missing (never the path: anyone may ask)
        status, body = http(gateway.url + "/static/hls.min.js")
        error = json.loads(body)["error"]
        assert status == 404 and error["param"] == "hls.min.js", body
        assert error["message"].startswith("no hls.js: FRAMEFLEET_API_HLS_JS names a file ")
        assert str(nowhere) not in error["message"]
        browser = Browser(binary, tmp_path)
        browser.start()
        try:
            # and the page says it, instead of a player that never starts
            page = open_page(browser, gateway.url, api_fleet.keys["acme"].secret)
            shown = wait_for(lambda: page.eval(
                "(m => !m.hidden && m.textContent)(document.getElementById('missing'))")
                or None, 20, "the missing-hls.js message")
            assert shown == error["message"], shown
            row_text(page, job)  # the list still works
            page.eval(f"document.querySelector('tr[data-id=\"{job}\"]').click()")
            assert page.eval("document.getElementById('status').textContent") == shown
            assert page.eval("document.getElementById('player').hidden") is True
        finally:
            browser.stop()
    finally:
        gateway.stop()


def test_the_empty_table_says_what_to_do_and_a_small_video_keeps_download_in_view(
        api_fleet: ApiFleet, tmp_path: Path) -> None:  # noqa: F811
    binary = require_binary("chromium", "Debian package chromium")
    fresh = api_fleet.keys["evil"]  # no job of this tenant in this module before this test
    browser = Browser(binary, tmp_path)
    browser.start()
    try:
        # Given a laptop-sized window and a key with no job yet
        page = browser.devtools()
        page.call("Emulation.setDeviceMetricsOverride", width=1280, height=720,
                  deviceScaleFactor=1, mobile=False)
        page = open_page(browser, api_fleet.gateway.url, fresh.secret)
        # Then the empty table says how to submit one, with this gateway's address
        hint = str(wait_for(lambda: page.eval(
            "(e => !e.hidden && e.textContent || null)(document.getElementById('empty'))"),
            30, "the empty table's hint"))
        assert f"{api_fleet.gateway.url}/v1/videos" in hint and "Authorization" in hint, hint
        assert "openai" in hint
        assert page.eval("document.querySelector('#jobs tbody').rows.length") == 0
        # And when a 64x64 job has rendered and is clicked
        status, body = http(api_fleet.gateway.url + "/v1/videos", fresh.headers,
                            {"model": "tiny", "prompt": "a red fox", "seconds": "0.5",
                             "size": "64x64"})
        assert status == 200, body
        video = json.loads(body)["id"]
        wait_for(lambda: job_state(api_fleet, video, "evil") == "SUCCESS" or None, 180, "its end")
        row_text(page, video, has="completed")
        assert page.eval("document.getElementById('empty').hidden") is True
        frames_shown(page, video)
        # Then the video keeps its aspect, and the note and Download stay in the first viewport
        box = page.eval("JSON.stringify((v => { const r = v.getBoundingClientRect(); return "
                        "{w: r.width, h: r.height, vw: v.videoWidth, vh: v.videoHeight}; })"
                        "(document.getElementById('video')))")
        box = json.loads(box)
        assert (box["vw"], box["vh"]) == (64, 64) and abs(box["w"] - box["h"]) <= 1, box
        bottom = page.eval("document.getElementById('download').getBoundingClientRect().bottom")
        assert 0 < bottom <= 720, (bottom, box)
        shot = page.call("Page.captureScreenshot")["data"]
        (tmp_path / "page-64x64.png").write_bytes(base64.b64decode(shot))
        assert page.eval("window.cspViolations") == []
    finally:
        browser.stop()


def _choose_photo(page: DevTools, selector: str, folder: Path) -> None:
    """A person's picture (a small PNG) picked in the file input at ``selector``, as the
    browser's file dialog does."""
    from PIL import Image

    path = folder / "photo.png"
    Image.radial_gradient("L").resize((48, 32)).convert("RGB").save(path)
    root = page.call("DOM.getDocument")["root"]["nodeId"]
    node = page.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
    page.call("DOM.setFileInputFiles", files=[str(path)], nodeId=node)


def _shown(page: DevTools) -> dict[str, Any]:
    """What the player shows: its note, the Download button, the playing job's row."""
    return dict(json.loads(page.eval(
        "JSON.stringify({note: document.getElementById('note').textContent, "
        "download: !document.getElementById('download').hidden, "
        "row: (r => r && r.textContent)(document.querySelector('tr.active')), "
        "f: window.framefleet})")))


def test_the_create_form_makes_a_video_shows_its_previews_then_plays_it(
        api_fleet: ApiFleet, tmp_path: Path) -> None:  # noqa: F811
    binary = require_binary("chromium", "Debian package chromium")
    acme = api_fleet.keys["acme"]
    browser = Browser(binary, tmp_path)
    browser.start()
    try:
        # Given the page with a key pasted, in a laptop's window: the form shows
        page = open_page(browser, api_fleet.gateway.url, acme.secret)
        page.call("Emulation.setDeviceMetricsOverride", width=1280, height=800,
                  deviceScaleFactor=1, mobile=False)
        wait_for(lambda: page.eval("!document.getElementById('create').hidden") or None, 20,
                 "the create form")
        # When a person picks an image for a model that takes none, the form says why
        page.eval("document.getElementById('model').value = 'tiny-slow'")
        page.eval("document.getElementById('prompt').focus()")
        page.call("Input.insertText", text="a red fox runs through deep snow")
        _choose_photo(page, "#image", tmp_path)
        page.eval("document.getElementById('create-button').click()")
        refused = wait_for(lambda: page.eval(
            "(s => s.classList.contains('error') && s.textContent)"
            "(document.getElementById('create-status'))") or None, 30, "the refusal")
        assert refused == "input_reference: this model takes no input image", refused
        assert page.eval("window.framefleet.playing") is None
        # and without it, submits: the new job is listed and shown at once
        page.eval("document.getElementById('image').value = ''")
        page.eval("document.getElementById('create-button').click()")
        video = str(wait_for(lambda: page.eval("window.framefleet.playing"), 30, "the new job"))
        assert page.eval("document.getElementById('create-status').textContent") == \
            f"created {video} (tiny-slow, 48x32, 0.5 s)"
        made = json.loads(http(api_fleet.gateway.url + f"/v1/videos/{video}", acme.headers)[1])
        assert (made["prompt"], made["model"]) == ("a red fox runs through deep snow", "tiny-slow")
        row_text(page, video)
        # Then its previews show in the player's place while it denoises (previews are on)
        wait_for(lambda: page.eval(
            "!document.getElementById('preview-box').hidden && "
            "document.getElementById('preview').readyState >= 2") or None, 120, "a preview")
        running = _shown(page)
        (tmp_path / "page-create-preview.png").write_bytes(  # the docs' img/page.png
            base64.b64decode(page.call("Page.captureScreenshot")["data"]))
        assert job_state(api_fleet, video) != "SUCCESS"
        assert running["f"]["preview"]["step"] >= 1 and running["f"]["live"] is False, running
        # 54.7: a running job's row and note say it is noise, and no MP4 is offered yet
        assert "random weights: noise" in running["row"], running["row"]
        assert running["note"] in ("live: the job is in_progress; random weights: noise",
                                   "live: the job is queued; random weights: noise"), running
        assert running["download"] is False, running
        # then the video plays,
        wait_for(lambda: page.eval("window.framefleet.live && window.framefleet.frames > 3")
                 or None, 180, "the video playing")
        wait_for(lambda: job_state(api_fleet, video) == "SUCCESS" or None, 120, "its end")
        # and once it succeeded the note no longer says it is live, and the MP4 is offered
        done = wait_for(lambda: (lambda s: s if s["download"] else None)(_shown(page)), 30,
                        "the note and Download of a finished job")
        assert done["note"] == "random weights: noise", done
        assert "completed (SUCCESS), random weights: noise" in done["row"], done
        (tmp_path / "page-create.png").write_bytes(
            base64.b64decode(page.call("Page.captureScreenshot")["data"]))
        assert page.eval("window.cspViolations") == []
    finally:
        browser.stop()
