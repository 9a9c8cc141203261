"""The README's quickstart, its first minute, the Python client's page (docs/python.md) and
docs/api.md, run exactly as written: their own lines, taken from their sections.

The quickstart starts Redis, SeaweedFS and a CPU worker, as a new user would. So that they
cannot meet anything else on this host, the lines run in a network namespace of their own
(``unshare --net``: only a loopback interface, nothing but loopback reachable), with ``HOME`` a
folder of the test, the venv's ``bin`` first on ``PATH`` (what ``. .venv/bin/activate`` does)
and no ``FRAMEFLEET_*`` or ``AWS_*`` variable of ours. The test adds only what the text says the
reader brings: ``photo.png``, a picture of theirs. Each run ends with the block that stops
everything; whatever is left is stopped by its process group (the test's own).
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
API_DOC = (REPO_ROOT / "docs" / "api.md").read_text()
PYTHON_DOC = (REPO_ROOT / "docs" / "python.md").read_text()
#: weed mini's default ports, as it names its sockets in /tmp (which it does not take from
#: TMPDIR): removed after the run if this run made them.
WEED_PORTS = {"master": 9333, "volume": 8080, "filer": 8888, "s3": 8333, "admin": 23646}
#: Lines of dependencies that a start must not print (worker/quiet.py), and the openai SDK's
#: deprecation of its videos API (the docs' example filters it).
NOISE = ("Failed to load", "Detected no triton", "_pytree", "Unable to import `torchao`",
         "requires torchvision", "FutureWarning", "DeprecationWarning", "The Sora API",
         "Loading pipeline components", "Loading weights", "Writing model shards")


def section(title: str, text: str = README, level: str = "##") -> str:
    start = text.index(f"\n{level} {title}\n")
    end = text.find(f"\n{level} ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(title: str, lang: str = "bash", text: str = README, level: str = "##") -> list[str]:
    return [str(b) for b in re.findall(rf"```{lang}\n(.*?)```", section(title, text, level),
                                       re.S)]


def quickstart_blocks() -> tuple[str, str]:
    """The quickstart's two bash blocks: start and use the fleet, then stop it."""
    found = blocks("Quickstart: a fleet on one machine")
    assert len(found) == 2, found
    return found[0], found[1]


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


def write_photo(folder: Path) -> Path:
    """The reader's picture: a small PNG."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    Image.radial_gradient("L").resize((80, 60)).convert("RGB").save(folder / "photo.png")
    return folder / "photo.png"


def run_as_written(tmp_path: Path, *parts: str) -> tuple[str, Path]:
    """``parts`` (the docs' lines and the test's markers) in one bash, in a namespace of its
    own, as the README's reader; returns the output and the quickstart's folder. The run
    must end with ``--- done``."""
    require_binary("redis-server", REDIS_INSTALL)
    require_binary("weed", WEED_INSTALL)
    prefix = own_network()
    home = tmp_path / "home"
    folder = home / "framefleet-quickstart"
    folder.mkdir(parents=True)  # no photo.png: the first minute's line makes it
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FRAMEFLEET_", "AWS_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(home), PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
               VIRTUAL_ENV=str(Path(venv_bin).parent), COLUMNS="200")
    script = "\n".join(["set -e", "ip link set lo up", *parts, "echo '--- done'"])
    started = time.time()
    proc = subprocess.Popen([*prefix, "bash", "-c", script], env=env, cwd=home, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out = ""
    try:
        out, _ = proc.communicate(timeout=780)
    finally:
        _stop_group(proc)
        # The S3 ports the quickstart chose (free ones: "S3 on 127.0.0.1:PORT (gRPC PORT)")
        chosen = re.search(r"(?m)^S3 on 127\.0\.0\.1:(\d+) \(gRPC (\d+)\)$", out)
        _remove_weed_sockets(started, (f"s3-{chosen[1]}", f"s3-grpc-{chosen[2]}")
                             if chosen else ())
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                   for p in sorted(folder.glob("*.log")))
    assert proc.returncode == 0, out + logs
    assert out.rstrip().endswith("--- done"), out
    return out, folder


def between(out: str, start: str, end: str) -> str:
    return out.split(start, 1)[1].split(end, 1)[0]


def check_quickstart(out: str) -> None:
    """The quickstart's job ran to its end, was reported, recorded and checked, as the README
    says."""
    assert re.search(r"(?m)^Redis on 127\.0\.0\.1:\d+$", out), out
    s3 = re.search(r"(?m)^S3 on 127\.0\.0\.1:(\d+) \(gRPC \d+\)$", out)
    assert s3 and s3[1] != "8333", out  # a free port, not weed's default
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
    assert "Traceback" not in out


def test_the_readme_quickstart_and_first_minute_run_as_written(tmp_path: Path) -> None:
    run, stop = quickstart_blocks()
    (first_minute,) = blocks("The first minute: prompt and image jobs without real weights")
    (example,) = blocks("Submit from Python", "python", text=PYTHON_DOC)
    script = tmp_path / "readme_example.py"
    script.write_text(example)
    out, folder = run_as_written(
        tmp_path, run, "echo '--- first minute'", first_minute, "echo '--- python example'",
        f"python {script}", "echo '--- stop'", stop)
    check_quickstart(out)
    # The first minute: a model and a LoRA made here, two demo jobs and a fleet job that all
    # say their weights are random, one segment said as one
    minute = between(out, "--- first minute", "--- python example")
    assert (folder / "models/tiny/framefleet_random_weights.json").is_file()
    assert (folder / "style.safetensors").is_file()
    assert minute.count("demo: 33 frames, 3 segments, ") == 2, minute  # its defaults
    assert len(re.findall(r"(?m)^demo: .*random weights: noise\)$", minute)) == 2, minute
    success = re.search(r"(?m)^SUCCESS fox-1: 9 frames, 1 segment, 64x64, wall [\d.]+ s, "
                        r"random weights: noise$", minute)
    assert success, minute
    assert re.search(r"(?m)^generate: tier exact, cache none, 4 steps, image [0-9a-f]{12}, "
                     r"LoRA [0-9a-f]{12} x0\.8$", minute), minute
    assert "manifest: s3://videos/out/default/fox-1/manifest.json" in minute
    # the picture came from the README's own line, and previews are on with no setting: a
    # preview's URI comes before the SUCCESS line
    assert (folder / "photo.png").stat().st_size > 100
    before = minute.split("SUCCESS fox-1")[0]
    assert re.search(r"(?m)^(preview after step \d/4: s3://videos/out/default/fox-1/previews/"
                     r"step-000\d\.mp4|previews: \d, the newest at s3://videos/out/default/"
                     r"fox-1/previews/latest\.mp4)( |$)", before), minute
    noise = [line for line in out.splitlines() if any(n in line for n in NOISE)]
    assert not noise, noise
    # The Python example: the job's URIs, a one-line cost, and a bad spec as its comment says
    example_out = between(out, "--- python example", "--- stop")
    assert "s3://videos/out/acme/clip-42/manifest.json" in example_out, example_out
    assert "s3://videos/out/acme/clip-42/index.m3u8" in example_out
    assert re.search(r"(?m)^\$\d+\.\d{6} total: GPU \$.*per video-minute", example_out)
    comment = re.search(r"print\(e\)  # one line naming each bad field: (.*)$", example, re.M)
    assert comment is not None, example
    shape = re.escape(comment.group(1)).replace("…", ".+")
    assert re.search(rf"(?m)^{shape}$", example_out), (comment.group(1), example_out)


def test_the_quickstart_leaves_a_redis_on_6379_alone(tmp_path: Path) -> None:
    # Given another Redis on 6379 (no persistence: a laptop's), holding one key of its own
    other = ("redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no "
             "--dir \"$HOME\" > \"$HOME/other-redis.log\" 2>&1 &\n"
             "until python -c 'import redis; redis.Redis(port=6379).set(\"mine\", 1)' "
             "2> /dev/null; do sleep 0.1; done")
    run, stop = quickstart_blocks()
    out, _ = run_as_written(
        tmp_path, other, run, "echo \"other redis keys: $(python -c 'import redis; "
        "print(sorted(redis.Redis(port=6379).keys()))')\"", stop)
    # When the quickstart runs as written, its fleet runs on a Redis of its own
    check_quickstart(out)
    assert not re.search(r"(?m)^Redis on 127\.0\.0\.1:6379$", out), out
    # and the other Redis holds only its own key
    assert "other redis keys: [b'mine']" in out, out


def test_docs_api_runs_as_written_on_the_quickstart(tmp_path: Path) -> None:
    run, stop = quickstart_blocks()
    (first_minute,) = blocks("The first minute: prompt and image jobs without real weights")
    (photo, make_model) = [line for line in first_minute.splitlines()
                           if line.startswith(("framefleet models tiny ", "python -c"))]
    setup, curl_block, native = (
        *blocks("Run it", text=API_DOC), *blocks("curl", text=API_DOC),
        *blocks("The native API", text=API_DOC))
    (sdk,) = blocks("The `openai` SDK", "python", text=API_DOC)
    script = tmp_path / "sdk_example.py"
    script.write_text(sdk)
    # The README's own SDK snippet, after the same setup
    (readme_sdk,) = blocks("HTTP API and the page (`framefleet api`)", "python")
    readme_script = tmp_path / "readme_sdk.py"
    readme_script.write_text(readme_sdk)
    # and the quickstart's --output line again, in the shell the gateway's setup ran in
    again = re.search(r"(?ms)^framefleet submit --input clip\.npy .*?--wait$", run)
    assert again is not None, run
    out, folder = run_as_written(
        tmp_path, run, photo, make_model, setup, "echo '--- curl'", curl_block,
        "echo '--- sdk'", f"python {script}", "echo '--- readme sdk'", f"python {readme_script}",
        "echo '--- output again'", again[0].replace("clip-1", "clip-2"),
        "echo '--- native'", native, "echo '--- stop'", stop)
    check_quickstart(out)
    readme_out = between(out, "--- readme sdk", "--- output again")
    assert re.search(r"(?m)^completed video_[0-9a-f]{32}\.[0-9a-f]+$", readme_out), readme_out
    again_out = between(out, "--- output again", "--- native")
    assert "SUCCESS clip-2: 49 frames" in again_out, again_out
    curls = between(out, "--- curl", "--- sdk")
    assert '"object":"video"' in curls and '"status":"completed"' in curls, curls
    assert '"random_weights":true' in curls and '"worker":"cpu0@' in curls, curls
    assert (folder / "fox.mp4").stat().st_size > 1000 and (folder / "head.bin").stat().st_size \
        == 1024
    assert curls.count('"model":"tiny"') >= 3  # created, listed, image-to-video
    sdk_out = between(out, "--- sdk", "--- readme sdk")
    assert re.search(r"(?m)^completed 100 [\d.e-]+ cpu0@\S+ True$", sdk_out), sdk_out
    assert re.search(r"(?m)^video_\S+ completed$", sdk_out), sdk_out
    events = between(out, "--- native", "--- stop")
    assert "event: end" in events and '"state": "SUCCESS"' in events, events
    noise = [line for line in out.splitlines() if any(n in line for n in NOISE)]
    assert not noise, noise


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


def _remove_weed_sockets(since: float, chosen: tuple[str, ...] = ()) -> None:
    names = [f"seaweedfs-{c}.sock" for c in chosen]
    for role, port in WEED_PORTS.items():
        names += [f"seaweedfs-{role}-{port}.sock", f"seaweedfs-{role}-grpc-{port + 10000}.sock"]
    for name in names:
        path = Path("/tmp") / name
        try:
            if path.stat().st_mtime >= since:
                path.unlink()
        except FileNotFoundError:
            pass
