"""The documentation site and its front door: ``mkdocs build --strict`` passes (every page of
the nav there, every link, anchor and image found), its home page holds the README's own
quickstart, the README stays a short front door, and the benchmark page's plots are drawn from
the committed results and agree with its prose."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: The material theme's notice about its successor is no warning of this site's.
QUIET = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def _nav_pages() -> list[str]:
    """Every page the nav of mkdocs.yml names."""
    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in walk(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in walk(value)]
        return []
    # mkdocs.yml uses no custom YAML tags, so the safe loader reads it
    return walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def test_the_site_builds_strict_with_the_readmes_quickstart(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=ROOT, env=QUIET, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    # Every page of the nav was built, with the images the pages show
    for page in _nav_pages():
        built = site / ("index.html" if page == "index.md" else f"{page[:-3]}/index.html")
        assert built.is_file(), page
    for image in re.findall(r"\]\((img/[\w.-]+)\)", "".join(
            p.read_text() for p in (ROOT / "docs").glob("*.md"))):
        assert (site / image).is_file(), image
    # and the home page is the README's own text (included, not copied): its quickstart's
    # prose and its blocks, which tests/test_quickstart.py runs
    home = (site / "index.html").read_text()
    assert "Redis, a local S3, one CPU worker, a job and its history" in home
    assert "No download: a tiny random Wan pipeline folder" in home
    assert "--8&lt;--" not in home and "--8<--" not in home
    assert 'src="img/page.png"' in home


def test_the_readme_is_a_front_door() -> None:
    lines = README.splitlines()
    assert len(lines) <= 250, len(lines)
    # What it is, then the two commands first, then the quickstart
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:2] == ["## Two commands", "## Quickstart: a fleet on one machine"], headings
    first_block = README.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [["make", "demo"], ["make", "test"]]
    # and where to go next: every docs page it links exists and is in the site's nav
    linked = set(re.findall(r"(?m)^\[[\w-]+\]: docs/([\w./-]+?)(?:#[\w-]+)?$", README))
    nav = set(_nav_pages())
    pages = {p for p in linked if p.endswith(".md")}
    assert pages and pages <= nav, pages - nav
    assert all((ROOT / "docs" / p).is_file() for p in linked), linked


def test_the_benchmark_plots_come_from_the_committed_results(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "docs/plots.py", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    drawn = {p.name for p in tmp_path.glob("*.png")}
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    shown = set(re.findall(r"\]\(img/(bench-[\w-]+\.png)\)", page))
    committed = {p.name for p in (ROOT / "docs" / "img").glob("bench-*.png")}
    assert drawn and drawn == shown == committed, (drawn, shown, committed)
    # The prose's speed-ups are the results' own
    for name in ("denoise-h200-5b.json", "denoise-h200-5b-fp8.json"):
        for row in json.loads((ROOT / "bench" / "results" / name).read_text())["rows"]:
            if row["steps"] == 20:
                assert f"{row['tier']} {row['speedup']:.2f}x" in page, row["tier"]
