"""The README, the docs pages and the Makefile stay true: every command and state listed, no
missing file. The README is the front door; what it used to hold lives in ``docs/`` now, and
each check reads the page where its text lives."""

from __future__ import annotations

import re
from pathlib import Path

from typer.main import get_command

from producer.cli.app import cli
from producer.client.jobstate import STATES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: Files the README and the docs tell the reader to create (never committed).
MADE_BY_THE_READER = {"docker/.env"}


def _section(page: str, title: str) -> str:
    """The ``## title`` section of ``docs/page``, up to the next ``## `` heading."""
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_cli_block_lists_every_command_and_the_table_every_state() -> None:
    section = _section("commands.md", "CLI")
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    listed = set(re.findall(r"(?m)^framefleet ([a-z][a-z-]*)", block))
    commands = set(getattr(get_command(cli), "commands", {}))
    assert commands and listed == commands, listed ^ commands
    assert "framefleet --version" in block
    table = set(re.findall(r"(?m)^\| `([A-Z]+)` \|", section))
    assert table == set(STATES), table ^ set(STATES)
    for documented in ("--timeout", "--json", "3600", "124", "Resubmitting after a cancel"):
        assert documented in section, documented


def test_the_readme_and_the_docs_name_only_files_of_the_repository() -> None:
    pages = [README, *(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))]
    text = "\n".join(pages)
    named = set(re.findall(
        r"`((?:producer|worker|tests|bench|infra|docker|scripts|examples)/[^`\s:]*)", text))
    missing = sorted(p for p in named - MADE_BY_THE_READER if not (ROOT / p).exists())
    assert not missing, missing
    # No concrete absolute path of some machine: file:// URIs are placeholders or built
    concrete = [u for u in re.findall(r"file:///[^\s`\"')]*", text) if u != "file:///…,"
                and not u.startswith(("file:///path", "file:///…"))]
    assert not concrete, concrete
    # (the images' own home, /home/framefleet, is a path of the images, not of a machine)
    for page in pages:
        found = re.search(r"(?<![\w.:/$}])/(?:models|work|root|home(?!/framefleet/)|srv)/", page)
        assert not found, (found, page[:40])


def test_the_weights_section_says_what_a_folder_is_and_how_to_make_one() -> None:
    section = _section("weights.md", "Decoder weights")
    for words in ("config.json", "diffusion_pytorch_model.safetensors", "AutoencoderKLWan",
                  "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "--include 'vae/*'", "save_pretrained",
                  '"random"', "random_weights", "no such folder"):
        assert words in section, words


def test_the_makefile_names_no_missing_file() -> None:
    makefile = (ROOT / "Makefile").read_text()
    named = set(re.findall(r"(?<![\w$(])((?:[\w.-]+/)+[\w.-]+\.(?:md|py|sh|toml|txt))",
                           makefile))
    assert "bench/README.md" in named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_every_webhook_event_has_its_payload_documented() -> None:
    from typing import get_args

    from producer.wire.spec import NotifyEvent

    section = _section("playback.md", "Webhooks")
    rows = dict(re.findall(r"(?m)^\| `([a-z]+)` \| [^|]+ \| (`\{.*\}`.*) \|$", section))
    assert set(rows) == set(get_args(NotifyEvent)), set(rows) ^ set(get_args(NotifyEvent))
    assert '"message"' in rows["cancelled"] and '"error"' in rows["failed"]


def test_the_exit_statuses_are_the_clis() -> None:
    from producer.cli import output

    table = dict(re.findall(r"(?m)^\| (\d+) \| ([^|]+) \|$", _section("commands.md", "CLI")))
    codes = {getattr(output, n) for n in dir(output) if n.startswith("EXIT_")}
    assert codes | {0, 2} == {int(c) for c in table}, table


def test_the_first_paragraph_says_what_the_fleet_generates() -> None:
    # A user searches for what the fleet does: prompts and images in, video out, per-job cost.
    prose = re.sub(r"(?m)^<!--.*-->\n", "", README)  # the docs' section markers
    first = prose.split("\n\n", 2)[1]
    for words in ("text-to-video", "image-to-video", "Wan2.1/2.2", "Celery", "Redis", "GPU",
                  "fMP4/HLS", "S3", "cost"):
        assert words in first, words
    assert "latents into" not in first
