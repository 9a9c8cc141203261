// framefleet's page: make a video (a prompt, a model, an optional image), list the key's jobs,
// play one live with hls.js, download its MP4. Until a generate job's first segment is in, its
// newest preview (a small clip of the model's estimate while it denoises) loops in the
// player's place.
// The key stays in this tab's sessionStorage and goes only into Authorization headers to
// this origin. Every value from the API is put in the page as text, never as HTML.
"use strict";
(function () {
  const KEY = "framefleet.key";
  // What a job made with random weights says, as the CLI does (producer/wire/weights.py).
  const NOISE = "random weights: noise";
  const $ = (id) => document.getElementById(id);
  const rows = $("jobs").querySelector("tbody");
  // What the player did, for people (the log) and for tests (window.framefleet).
  const state = window.framefleet = { events: [], frames: 0, playing: null, jobs: [],
                                      preview: null, live: false, models: [] };
  let hls = null, timer = null, previewTimer = null;

  function key() { return sessionStorage.getItem(KEY); }
  function auth() { return { Authorization: "Bearer " + key() }; }
  function say(text) { $("status").textContent = text; }
  function log(name, detail) {
    const entry = { t: Date.now(), name: name, detail: detail || null };
    state.events.push(entry);
    $("log").textContent += name + (detail ? " " + JSON.stringify(detail) : "") + "\n";
  }

  function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }

  // What the player says under the video, from the job's latest object: the state while it
  // runs, the failure, and the noise label (a job of random weights, even while it runs).
  function noteText(v) {
    const ff = v.framefleet || {};
    const parts = [];
    if (v.status === "failed") parts.push("failed: " + (v.error ? v.error.message : v.status));
    else if (v.status !== "completed") parts.push("live: the job is " + v.status);
    if (ff.random_weights) parts.push(NOISE);
    return parts.join("; ");
  }
  // The note and the Download button follow the job shown: an MP4 exists once it completed.
  function showState(v) {
    $("note").textContent = noteText(v);
    $("download").hidden = v.status !== "completed";
  }

  function render(videos) {
    rows.replaceChildren();
    // An empty table says how to fill it (the form above, curl, the SDK).
    $("empty").hidden = videos.length > 0;
    for (const v of videos) {
      const tr = document.createElement("tr");
      tr.dataset.id = v.id;
      if (v.id === state.playing) tr.classList.add("active");
      const ff = v.framefleet || {};
      const bar = document.createElement("progress");
      bar.max = 100; bar.value = v.progress;
      const p = cell(" " + v.progress + "%"); p.prepend(bar);
      const noise = ff.random_weights ? ", " + NOISE : "";
      tr.append(cell(v.id), cell(v.model),
                cell(v.status + (ff.state ? " (" + ff.state + ")" : "") + noise),
                p, cell(ff.cost_usd == null ? "" : "$" + ff.cost_usd.toFixed(6)),
                cell(new Date(v.created_at * 1000).toLocaleString()));
      tr.addEventListener("click", () => play(v));
      rows.append(tr);
      if (v.id === state.playing) showState(v);
    }
  }

  async function refresh() {
    $("create").hidden = !key();
    if (!key()) { rows.replaceChildren(); $("empty").hidden = true; return; }
    try {
      const r = await fetch("/v1/videos?limit=50", { headers: auth() });
      const body = await r.json();
      if (!r.ok) { say(body.error ? body.error.message : "HTTP " + r.status); return; }
      state.jobs = body.data;
      say("");
      render(body.data);
    } catch (e) { say(String(e)); }
  }

  function jobUrl(id) { return "/v1/jobs/" + encodeURIComponent(id); }

  // The newest preview in the player's place, until the live stream has a segment to show.
  async function showPreview(id) {
    const r = await fetch(jobUrl(id), { headers: auth() });
    if (!r.ok || state.playing !== id || state.live) return;
    const job = await r.json();
    const p = job.progress && job.progress.preview;
    if (job.status === "completed" || job.status === "failed") stopPreview();
    if (!p || (state.preview && state.preview.step >= p.step)) return;
    const step = String(p.step).padStart(4, "0");
    const f = await fetch(jobUrl(id) + "/files/previews/step-" + step + ".mp4",
                          { headers: auth() });
    if (!f.ok || state.playing !== id || state.live) return;
    const el = $("preview");
    const old = el.src;
    el.src = URL.createObjectURL(await f.blob());
    if (old) URL.revokeObjectURL(old);
    $("preview-note").textContent = "preview: denoise step " + p.step + "/" + p.steps_total;
    $("preview-box").hidden = false;
    $("video").hidden = true;
    state.preview = { step: p.step, width: p.width, height: p.height, frames: p.frames };
    log("preview", { step: p.step });
  }
  function stopPreview() { clearInterval(previewTimer); previewTimer = null; }
  function showLive() {
    if (state.live) return;
    state.live = true;
    stopPreview();
    if (!$("preview-box").hidden) log("live");
    $("preview-box").hidden = true;
    $("video").hidden = false;
  }

  function play(v) {
    if (typeof Hls === "undefined") { say(state.missing || "no hls.js: cannot play"); return; }
    state.playing = v.id;
    state.preview = null; state.live = false;
    stopPreview();
    const shown = $("preview");
    if (shown.src) { URL.revokeObjectURL(shown.src); shown.removeAttribute("src"); }
    $("preview-box").hidden = true;
    $("video").hidden = false;
    if (v.status !== "completed" && v.status !== "failed") {
      previewTimer = setInterval(() => showPreview(v.id).catch((e) => log("preview-error",
                                                                         String(e))), 1000);
    }
    $("player").hidden = false;
    $("playing").textContent = v.id;
    showState(v);
    $("log").textContent = "";
    state.events = []; state.frames = 0;
    if (hls) hls.destroy();
    const video = $("video");
    const src = "/v1/jobs/" + encodeURIComponent(v.id) + "/files/index.m3u8";
    hls = new Hls({ enableWorker: false, xhrSetup: (xhr) => {
      xhr.setRequestHeader("Authorization", "Bearer " + key()); } });
    let retries = 0;
    const E = Hls.Events;
    for (const name of [E.MANIFEST_PARSED, E.LEVEL_LOADED, E.FRAG_LOADED, E.FRAG_BUFFERED]) {
      hls.on(name, (_, d) => log(name, name === E.LEVEL_LOADED
        ? { live: d.details.live, fragments: d.details.fragments.length }
        : name === E.FRAG_LOADED || name === E.FRAG_BUFFERED ? { sn: d.frag.sn } : null));
    }
    hls.on(E.ERROR, (_, d) => {
      log(E.ERROR, { type: d.type, details: d.details, fatal: d.fatal });
      // No playlist yet (the job is still queued): look again, for a while.
      if (d.fatal && d.type === Hls.ErrorTypes.NETWORK_ERROR && retries++ < 60) {
        setTimeout(() => hls.loadSource(src), 2000);
      }
    });
    hls.on(E.MANIFEST_PARSED, () => video.play().catch((e) => log("play-error", String(e))));
    hls.on(E.FRAG_BUFFERED, showLive);
    hls.loadSource(src);
    hls.attachMedia(video);
    const onFrame = () => { state.frames++; video.requestVideoFrameCallback(onFrame); };
    video.requestVideoFrameCallback(onFrame);
    video.onplaying = () => log("playing");
    video.onended = () => log("ended");
    refresh();
  }

  async function download() {
    const id = state.playing;
    const r = await fetch("/v1/videos/" + encodeURIComponent(id) + "/content", { headers: auth() });
    if (!r.ok) { const b = await r.json(); say(b.error.message); return; }
    const url = URL.createObjectURL(await r.blob());
    const a = document.createElement("a");
    a.href = url; a.download = id + ".mp4";
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  // The create form: POST /v1/videos as a multipart form (the SDK's shape), with the key
  // already on the page. Empty fields are left out: the model's defaults apply. The new job
  // is listed and played at once: its previews, then the video.
  function createSay(text, error) {
    $("create-status").textContent = text;
    $("create-status").classList.toggle("error", !!error);
  }
  async function create(e) {
    e.preventDefault();
    const body = new FormData();
    body.append("prompt", $("prompt").value);
    for (const name of ["model", "size", "seconds"]) {
      const value = $(name).value.trim();
      if (value) body.append(name, value);
    }
    // Checked: the worker's own default (every 2 steps); unchecked: none.
    if (!$("previews").checked) body.append("preview", JSON.stringify({ every: 0 }));
    const image = $("image").files[0];
    if (image) body.append("input_reference", image, image.name);
    $("create-button").disabled = true;
    createSay("submitting…");
    try {
      const r = await fetch("/v1/videos", { method: "POST", headers: auth(), body: body });
      const v = await r.json();
      if (!r.ok) { createSay(v.error ? v.error.message : "HTTP " + r.status, true); return; }
      createSay("created " + v.id + " (" + v.model + ", " + v.size + ", " + v.seconds + " s)");
      log("created", { id: v.id });
      await refresh();
      play(v);
    } catch (err) {
      createSay(String(err), true);
    } finally {
      $("create-button").disabled = false;
    }
  }
  // The models the key may name, where the gateway lists them (GET /v1/models, the OpenAI
  // shape); without the list the field is free text and empty means the map's first model.
  async function loadModels() {
    if (!key()) return;
    try {
      const r = await fetch("/v1/models", { headers: auth() });
      if (!r.ok) return;
      const body = await r.json();
      const list = $("models");
      list.replaceChildren();
      for (const m of body.data || []) {
        const option = document.createElement("option");
        option.value = m.id;
        list.append(option);
      }
      if (!$("model").value && body.data && body.data.length) $("model").value = body.data[0].id;
      state.models = (body.data || []).map((m) => m.id);
    } catch (err) { log("models-error", String(err)); }
  }

  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("key").value.trim();
    if (value) sessionStorage.setItem(KEY, value);
    $("key").value = "";
    refresh();
    loadModels();
  });
  $("create-form").addEventListener("submit", create);
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY); state.jobs = []; rows.replaceChildren();
    $("empty").hidden = true; $("create").hidden = true; say("key forgotten");
  });
  $("download").addEventListener("click", download);
  // No hls.js (the gateway could not find it): say what is missing, never a silent player.
  if (typeof Hls === "undefined") {
    fetch("/static/hls.min.js").then((r) => r.json()).then((b) => {
      state.missing = b.error ? b.error.message : "no hls.js";
    }).catch(() => { state.missing = "no hls.js: this page cannot play videos"; })
      .finally(() => { $("missing").textContent = state.missing; $("missing").hidden = false; });
  }
  for (const el of document.querySelectorAll("#empty .origin")) el.textContent = location.origin;
  refresh();
  loadModels();
  timer = setInterval(refresh, 2000);
  window.addEventListener("pagehide", () => { clearInterval(timer); stopPreview(); });
})();
