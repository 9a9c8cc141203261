"""The start's breakdown (worker/lifecycle/startphases.py): the warm-up model's read, cast and
compile-cache phases and the decoder's warm-up are recorded before ready, in the readiness
state, the framefleet_worker_start_seconds gauge and `framefleet fleet`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from producer.cli.app import cli
from producer.settings import Settings, get_settings
from tests.worker.generate.tiny import save_tiny_model
from worker import metrics
from worker.lifecycle import startphases, warmup
from worker.run import default_decoders


def test_a_process_start_is_read_from_proc() -> None:
    started = startphases.started_at(os.getpid())
    assert started is not None and 0 <= time.time() - started < 3600
    assert startphases.started_at(2**22 + 1) is None  # no such process
    assert startphases.main_started_at() <= time.time()


def test_a_child_started_now_is_told_to_the_clock_tick() -> None:
    # /proc/stat's btime is whole seconds: a start read through it can fall up to a second
    # before the moment the child was forked (the CI failure this guards against)
    for _ in range(5):
        before = time.time()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        try:
            started = startphases.started_at(child.pid)
            assert started is not None
            assert before - 0.02 <= started <= time.time() + 0.02, (before, started)
        finally:
            child.kill()
            child.wait()


def test_phases_are_published_before_ready(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tiny_model = save_tiny_model(tmp_path / "tiny")
    # Given a CPU worker whose warm-up model is a tiny folder, and a warm-up decoder
    settings = Settings(device="cpu", work_dir=str(tmp_path), warmup_model=str(tiny_model),
                        warmup_decoder="pattern", warmup_latent_size="2x3",
                        broker_url="redis://:s3cret@10.1.2.3:6380/0")  # fleet shows its own
    started = time.time() - 2.0  # as if the process had started two seconds ago
    # When it warms up
    state = warmup.warm_up(default_decoders(settings), settings, started=started,
                           phases={"imports": 1.5, "init": 0.1})
    # Then every phase is there, the model's read is counted, and the total spans them all
    assert state.ready
    assert list(state.phases) == list(startphases.PHASES)  # in the ready line's order
    assert state.phases["read"] > 0 and state.phases["imports"] == 1.5
    # and every second of the start belongs to a phase of the critical path: it adds up to
    # the total (nothing overlaps on the CPU: it is every phase's own seconds)
    assert sum(state.critical.values()) == pytest.approx(state.phases["total"], abs=0.01)
    assert state.critical["imports"] == pytest.approx(1.5, abs=0.01)
    assert all(v <= state.phases[k] + 0.01 for k, v in state.critical.items())
    gauge = {s.labels["phase"]: s.value for s in metrics.WORKER_START.collect()[0].samples}
    assert gauge == state.phases
    path = {s.labels["phase"]: s.value
            for s in metrics.WORKER_START_CRITICAL.collect()[0].samples}
    assert path == state.critical
    # and `framefleet fleet` shows them for this host's worker process
    monkeypatch.setenv("FRAMEFLEET_WORK_DIR", str(tmp_path))
    monkeypatch.setenv("FRAMEFLEET_BROKER_URL", "redis://:s3cret@10.1.2.3:6380/0")
    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(cli, ["fleet"])
        shown = json.loads(CliRunner().invoke(cli, ["fleet", "--json"]).output)
    finally:
        get_settings.cache_clear()
    assert out.exit_code == 0, out.output
    assert f"worker process {os.getpid()}: ready " in out.output and "read " in out.output
    # naming this host and the broker asked, without its password
    assert out.output.splitlines()[0] == \
        f"host {socket.gethostname()}, broker redis://10.1.2.3:6380", out.output
    assert "s3cret" not in out.output
    assert [s["phases"] for s in shown] == [state.phases]


def test_ready_comes_after_the_builds_the_warm_up_queued(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 the decoder's warm-up queued its first-chunk graph as a build (22 s cold)
    that ran after ready: a first job that met it waited, 30.1 s against 5.6 s. The start now
    waits for what its warm-up queued, as the ``builds`` phase."""
    from worker.owner import DEVICE

    settings = Settings(device="cpu", work_dir=str(tmp_path), warmup_decoder="pattern",
                        warmup_latent_size="2x3")
    decoders = default_decoders(settings)
    built = threading.Event()
    real_get = decoders.get

    def get(spec: Any) -> Any:  # the decoder's warm-up queues a build, as the Wan graphs' do
        decoder = real_get(spec)
        real_warmup = decoder.warmup

        def warmup_and_queue(h: int, w: int) -> None:
            real_warmup(h, w)
            DEVICE.submit("test first-chunk graph", lambda: (time.sleep(0.5), built.set()))

        monkeypatch.setattr(decoder, "warmup", warmup_and_queue)
        return decoder

    monkeypatch.setattr(decoders, "get", get)
    state = warmup.warm_up(decoders, settings, started=time.time())
    assert state.ready and built.is_set()
    assert state.phases["builds"] >= 0.5


def test_the_critical_path_charges_each_second_to_what_the_start_waited_for() -> None:
    # Given a start whose decoder graphs built beside the read, their capture waiting for it
    spans = [("imports", 0.0, 2.0), ("init", 2.0, 2.5), ("read", 2.5, 12.0),
             ("model_decode", 3.0, 6.0), ("model_decode", 12.0, 12.5),
             ("compile_cache", 12.5, 16.0)]
    # When its critical path is taken to ready at 16.5
    path = startphases.critical(spans, 0.0, 16.5)
    # Then the read holds the graphs' compile, the capture after it is theirs, the half
    # second no step held is other, and it all adds up to the wall
    assert path == {"imports": 2.0, "init": 0.5, "read": 9.5, "model_decode": 0.5,
                    "compile_cache": 3.5, "other": 0.5}
    phases = {**startphases.own(spans), "other": 0.5, "total": 16.5}
    assert phases["model_decode"] == 3.5 and sum(path.values()) == 16.5
    line = startphases.ready_line(phases, path)
    assert line.startswith("16.5 s after its start: imports 2.0 s, init 0.5 s, read 9.5 s, "
                           "model_decode 0.5 s, compile_cache 3.5 s, other 0.5 s "
                           "(the critical path); beside it: model_decode (3.0 s)"), line


def test_a_build_that_waited_for_the_weights_has_the_wait_cut_from_its_span() -> None:
    from worker.generate.model.graphs import cut

    assert cut("model_decode", 3.0, 12.5, [(6.0, 12.0)]) == [("model_decode", 3.0, 6.0),
                                                             ("model_decode", 12.0, 12.5)]
    assert cut("model_decode", 3.0, 5.0, []) == [("model_decode", 3.0, 5.0)]
    assert cut("model_decode", 3.0, 5.0, [(3.0, 5.0)]) == []
