"""Build time and size of the two images, and what their bytes are.

    python bench/fleet/docker_images.py --out bench/results/docker-images-cpu

For each image: a build without cache (every layer made, packages downloaded), then the
rebuild after a change of code only (what a developer's push costs), its size, its layers
(``docker history``) and the largest packages of its virtual environment (``du`` inside).
The worker is the CPU build (``TORCH_VERSION=2.13.0+cpu`` from ``wheels/``, as compose's cpu
profile builds it). Builds run from a scratch copy of the build context, so the code change
never touches the checkout. Where no registry is reachable, run
``scripts/docker-standins.sh`` first: the bases are then the Debian stand-ins, and the JSON
says so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONTEXT = ("pyproject.toml", "README.md", ".dockerignore", "producer", "worker", "wheels",
           "docker")
IMAGES: dict[str, dict[str, Any]] = {
    "producer": {"dockerfile": "docker/Dockerfile.producer", "tag": "framefleet-producer:bench",
                 "args": {}},
    "worker-cpu": {"dockerfile": "docker/Dockerfile.worker", "tag": "framefleet-worker:bench-cpu",
                   "args": {"TORCH_VERSION": "2.13.0+cpu", "TORCH_INDEX_URL": ""}},
}
VENV = "/opt/framefleet"


def docker(*args: str, timeout: float = 3600) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"docker {' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def build(context: Path, image: dict[str, Any], no_cache: bool) -> float:
    args = [f"--build-arg={k}={v}" for k, v in image["args"].items()]
    start = time.monotonic()
    docker("build", *(["--no-cache"] if no_cache else []), *args, "-f", image["dockerfile"],
           "-t", image["tag"], str(context))
    return round(time.monotonic() - start, 1)


def layers(tag: str) -> list[dict[str, Any]]:
    out = docker("history", "--no-trunc", "--format", "{{json .}}", tag)
    rows = [json.loads(line) for line in out.splitlines()]
    return [{"size": r["Size"], "created_by": " ".join(r["CreatedBy"].split())[:160]}
            for r in rows if r["Size"] not in ("0B", "0")]


def du(tag: str) -> dict[str, Any]:
    """Sizes (MB) in the image: the environment, the code, the largest packages."""
    script = (f"du -sm {VENV} {VENV}-app | sort -rn; "
              f"du -sm {VENV}/lib/python3*/site-packages/* | sort -rn | head -15")
    out = docker("run", "--rm", "--entrypoint", "sh", tag, "-c", script)
    sizes = [(int(n), p) for n, p in (line.split("\t", 1) for line in out.splitlines())]
    top = {Path(p).name: n for n, p in sizes[2:]}
    return {"venv_mb": sizes[0][0] if sizes[0][1] == VENV else sizes[1][0],
            "app_mb": next(n for n, p in sizes[:2] if p.endswith("-app")),
            "largest_packages_mb": top}


def measure(name: str, image: dict[str, Any], context: Path) -> dict[str, Any]:
    fresh = build(context, image, no_cache=True)
    marker = context / "producer" / "__init__.py"
    marker.write_text(marker.read_text() + f"\n# bench {time.time()}\n")
    rebuild = build(context, image, no_cache=False)
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image["tag"]))
    labels = docker("image", "inspect", "--format", "{{json .Config.Labels}}", image["tag"])
    print(f"{name}: {fresh} s without cache, {rebuild} s after a code change, "
          f"{size / 1e6:.0f} MB")
    return {"build_no_cache_s": fresh, "rebuild_after_code_change_s": rebuild,
            "size_mb": round(size / 1e6), "on_standin_base": "org.framefleet.standin" in labels,
            "layers": layers(image["tag"]), "contents": du(image["tag"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results path without extension (.json)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))  # run as a script: the repository root holds bench.report
    from bench.report import machine, write_json

    results: dict[str, Any] = {
        "command": "python bench/fleet/docker_images.py --out " + args.out,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**machine(),
                    "docker": docker("version", "--format", "{{.Server.Version}}").strip()},
        "images": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp)
        for name in CONTEXT:
            src = REPO / name
            if src.is_dir():
                shutil.copytree(src, context / name, ignore=shutil.ignore_patterns(
                    "__pycache__", ".env"))
            else:
                shutil.copy2(src, context / name)
        for name, image in IMAGES.items():
            results["images"][name] = measure(name, image, context)
    for image in IMAGES.values():
        docker("image", "rm", image["tag"])
    write_json(args.out + ".json", results)


if __name__ == "__main__":
    main()
