"""The README and the Makefile stay true: every command and state listed, no missing file."""

from __future__ import annotations

import re
from pathlib import Path

from typer.main import get_command

from producer.cli.app import cli
from producer.client.jobstate import STATES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: Files the README tells the reader to create (never committed).
MADE_BY_THE_READER = {"docker/.env"}


def _section(title: str) -> str:
    start = README.index(f"\n### {title}\n")
    end = README.index("\n### ", start + 1)
    return README[start:end]


def test_the_cli_block_lists_every_command_and_the_table_every_state() -> None:
    section = _section("CLI")
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    listed = set(re.findall(r"(?m)^framefleet ([a-z][a-z-]*)", block))
    commands = set(getattr(get_command(cli), "commands", {}))
    assert commands and listed == commands, listed ^ commands
    assert "framefleet --version" in block
    table = set(re.findall(r"(?m)^\| `([A-Z]+)` \|", section))
    assert table == set(STATES), table ^ set(STATES)
    for documented in ("--timeout", "--json", "3600", "124", "Resubmitting after a cancel"):
        assert documented in section, documented


def test_the_readme_names_only_files_of_the_repository() -> None:
    text = README + (ROOT / "docs" / "deploy.md").read_text()
    named = set(re.findall(
        r"`((?:producer|worker|tests|bench|infra|docker|scripts|examples)/[^`\s:]*)", text))
    missing = sorted(p for p in named - MADE_BY_THE_READER if not (ROOT / p).exists())
    assert not missing, missing
    # No concrete absolute path of some machine: file:// URIs are placeholders or built
    concrete = [u for u in re.findall(r"file:///[^\s`\"')]*", README) if u != "file:///…,"
                and not u.startswith(("file:///path", "file:///…"))]
    assert not concrete, concrete
    assert not re.search(r"(?<![\w.:/])/(?:models|work|root|home|srv)/", README)


def test_the_weights_section_says_what_a_folder_is_and_how_to_make_one() -> None:
    section = _section("Weights")
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

    section = _section("Live playback and webhooks")
    rows = dict(re.findall(r"(?m)^\| `([a-z]+)` \| [^|]+ \| (`\{.*\}`.*) \|$", section))
    assert set(rows) == set(get_args(NotifyEvent)), set(rows) ^ set(get_args(NotifyEvent))
    assert '"message"' in rows["cancelled"] and '"error"' in rows["failed"]


def test_the_exit_statuses_are_the_clis() -> None:
    from producer.cli import output

    table = dict(re.findall(r"(?m)^\| (\d+) \| ([^|]+) \|$", _section("CLI")))
    codes = {getattr(output, n) for n in dir(output) if n.startswith("EXIT_")}
    assert codes | {0, 2} == {int(c) for c in table}, table


def test_the_first_paragraph_says_what_the_fleet_generates() -> None:
    # A user searches for what the fleet does: prompts and images in, video out, per-job cost.
    first = README.split("\n\n", 2)[1]
    for words in ("text-to-video", "image-to-video", "Wan2.1/2.2", "Celery", "Redis", "GPU",
                  "fMP4/HLS", "S3", "cost"):
        assert words in first, words
    assert "latents into" not in first
