"""The README's quickstart, run exactly as written: its own lines, taken from its section.

The quickstart starts Redis, SeaweedFS and a CPU worker on their usual ports (6379, 8333, …),
as a new user would. So that they cannot meet anything else on this host, the lines run in a
network namespace of their own (``unshare --net``: only a loopback interface, nothing but
loopback reachable), with ``HOME`` a folder of the test, the venv's ``bin`` first on ``PATH``
(what ``. .venv/bin/activate`` does) and no ``FRAMEFLEET_*`` or ``AWS_*`` variable of ours.
After the quickstart's block, the README's Python example runs in the same shell, then the
block that stops everything. Whatever is left is stopped by its process group (the test's own).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.require import missing, require_binary
from tests.services import REDIS_INSTALL, REPO_ROOT, WEED_INSTALL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
README = (REPO_ROOT / "README.md").read_text()
#: weed mini's default ports, as it names its sockets in /tmp (which it does not take from
#: TMPDIR): removed after the run if this run made them.
WEED_PORTS = {"master": 9333, "volume": 8080, "filer": 8888, "s3": 8333, "admin": 23646}


def section(title: str) -> str:
    start = README.index(f"\n### {title}\n")
    end = README.find("\n### ", start + 1)
    return README[start:end if end > 0 else None]


def quickstart_blocks() -> tuple[str, str]:
    """The quickstart's two bash blocks: start and use the fleet, then stop it."""
    blocks = re.findall(r"```bash\n(.*?)```", section("Quickstart: a fleet on one machine"), re.S)
    assert len(blocks) == 2, blocks
    return blocks[0], blocks[1]


def python_example() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", section("Submit from Python"), re.S)
    return str(block)


def own_network() -> list[str]:
    """The command prefix that runs a command in a new network namespace, or skip."""
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else [
        "unshare", "--user", "--map-root-user", "--net"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    except FileNotFoundError:
        probe = None
    if probe is None or probe.returncode != 0:
        missing("a network namespace (unshare --net)",
                "util-linux, and allow unprivileged user namespaces")
    return prefix


def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    require_binary("redis-server", REDIS_INSTALL)
    require_binary("weed", WEED_INSTALL)
    prefix = own_network()
    run, stop = quickstart_blocks()
    example = tmp_path / "readme_example.py"
    example.write_text(python_example())
    home = tmp_path / "home"
    home.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FRAMEFLEET_", "AWS_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(home), PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
               VIRTUAL_ENV=str(Path(venv_bin).parent), COLUMNS="200")
    # The README's lines verbatim; around them only the loopback interface of the new
    # namespace, and the Python example between the two blocks.
    script = "\n".join([
        "set -e", "ip link set lo up", run, "echo '--- python example'",
        f"python {example}", "echo '--- stop'", stop, "echo '--- done'"])
    started = time.time()
    proc = subprocess.Popen([*prefix, "bash", "-c", script], env=env, cwd=home, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        _stop_group(proc)
        _remove_weed_sockets(started)
    folder = home / "framefleet-quickstart"
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                   for p in sorted(folder.glob("*.log")))
    assert proc.returncode == 0, out + logs
    assert out.rstrip().endswith("--- done"), out
    # The job ran to its end, was reported, recorded and checked, as the README says
    assert "SUCCESS clip-1: 49 frames, 2 segments, 416x240" in out, out
    assert "manifest: s3://videos/out/default/clip-1/manifest.json" in out
    assert re.search(r"(?m)^cost: \$\d+\.\d{6} total: GPU \$", out), out
    assert "clip-1: SUCCESS" in out
    assert re.search(r"(?m)^ \S+ \S+\s+clip-1\s+success\s+cpu0@", out), out  # jobs list
    doctor = [line for line in out.splitlines() if line.startswith(("OK ", "WARN", "FAIL"))]
    assert doctor and not [line for line in doctor if line.startswith("FAIL")], doctor
    assert any(line.startswith("OK   live workers: 1 answered a ping: cpu0@") for line in doctor)
    assert any(line.startswith("OK   broker persistence: append-only file on") for line in doctor)
    assert any(line.startswith("OK   ledger: s3://videos/ledger") for line in doctor)
    # The Python example: the job's URIs, a one-line cost, and a bad spec as one line
    example_out = out.split("--- python example", 1)[1].split("--- stop", 1)[0]
    assert "s3://videos/out/acme/clip-42/manifest.json" in example_out, example_out
    assert "s3://videos/out/acme/clip-42/index.m3u8" in example_out
    assert re.search(r"(?m)^\$\d+\.\d{6} total: GPU \$.*per video-minute", example_out)
    assert re.search(r"(?m)^invalid job spec: job_id: .*; output.uri: ", example_out)
    assert "Traceback" not in out


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL, to the test's own process group (the namespace's processes:
    Redis, weed and the worker run as jobs of its shell, in its group)."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
    proc.wait(timeout=10)


def _remove_weed_sockets(since: float) -> None:
    for role, port in WEED_PORTS.items():
        for name in (f"seaweedfs-{role}-{port}.sock", f"seaweedfs-{role}-grpc-{port + 10000}.sock"):
            path = Path("/tmp") / name
            try:
                if path.stat().st_mtime >= since:
                    path.unlink()
            except FileNotFoundError:
                pass
