"""Worker warm-up and readiness (worker/lifecycle/warmup.py): the compile cache folder, the
state files that `framefleet healthcheck` reads, and the ready gauge. CPU only (the pattern
decoder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from producer.errors import SettingsError
from producer.settings import Settings
from producer.state import readiness
from worker import metrics
from worker.lifecycle import warmup
from worker.run import DecoderCache


def test_compile_cache_folder_holds_inductor_and_triton_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(name, "/elsewhere")  # torch's own default, written on first use
    assert warmup.use_compile_cache(str(tmp_path / "cc")) == str(tmp_path / "cc")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cc" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "cc" / "triton")
    assert (tmp_path / "cc" / "inductor").is_dir() and (tmp_path / "cc" / "triton").is_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/kept")
    assert warmup.use_compile_cache(None) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/kept"


def test_warm_up_reports_ready_after_every_size(tmp_path: Path) -> None:
    # Given a worker configured to warm up two sizes
    settings = Settings(work_dir=str(tmp_path), warmup_decoder="pattern",
                        warmup_latent_size="2x3,4x4", compile_cache_dir=str(tmp_path / "cc"))
    metrics.WORKER_READY.set(0)
    # When it warms up
    state = warmup.warm_up(DecoderCache(torch.device("cpu")), settings)
    # Then both sizes ran, the gauge says ready and so does its state file
    assert state.ready and [s["size"] for s in state.sizes] == ["2x3", "4x4"]
    assert all(s["graph"] is False for s in state.sizes)  # CPU: no graphs
    assert metrics.WORKER_READY._value.get() == 1
    assert readiness.not_ready(settings) == []
    saved = json.loads((readiness.state_dir(settings) / f"{os.getpid()}.json").read_text())
    assert saved["ready"] and saved["cache_dir"] == str(tmp_path / "cc")


def test_not_ready_until_every_live_worker_is_ready(tmp_path: Path) -> None:
    settings = Settings(work_dir=str(tmp_path))
    folder = readiness.state_dir(settings)
    assert readiness.not_ready(settings) == ["no worker process on this host has started"]
    # A worker process still warming up (this one) keeps the host not ready
    start = readiness.process_start_time(os.getpid()) or ""
    me = readiness.WarmupState(pid=os.getpid(), start=start, decoder="wan2.2-vae")
    readiness.write_state(folder, me)
    assert readiness.not_ready(settings) == [f"worker process {os.getpid()} still warming up "
                                          "wan2.2-vae"]
    # A ready file of a process that has exited is ignored and removed
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(done.stdout)
    readiness.write_state(folder, readiness.WarmupState(pid=dead, start="1", ready=True))
    states = readiness.live_states(folder)
    assert [s.pid for s in states] == [os.getpid()]
    assert not (folder / f"{dead}.json").exists()


def test_reused_pid_is_not_taken_for_the_old_ready_worker(tmp_path: Path) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc (Linux) to tell a reused pid by its start time")
    settings = Settings(work_dir=str(tmp_path))
    # The pid is alive (this process) but its start time is not the one the file recorded:
    # a container restarted and its new process got the old pid.
    readiness.write_state(readiness.state_dir(settings),
                  readiness.WarmupState(pid=os.getpid(), start="1", ready=True))
    assert readiness.not_ready(settings) == ["no worker process on this host has started"]


def test_warm_up_settings() -> None:
    assert Settings(warmup_decoder="wan2.2-vae", warmup_latent_size="44x80,60x104")
    assert warmup.parse_sizes("44x80,60x104") == [(44, 80), (60, 104)]
    for bad in ("44x80,", "44*80", "1,2"):
        with pytest.raises(SettingsError, match="FRAMEFLEET_WARMUP_LATENT_SIZE"):
            Settings(warmup_latent_size=bad)
