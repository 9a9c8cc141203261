"""The one port rule (``producer/ports.py``) in every place that names a port: compose, the
Prometheus configuration, the images, the settings, the exporter's help and the docs.

Every expected number is derived from ``producer.ports``; none is written here. (The worker
scrape targets of compose against the rule, and the Kubernetes manifests, are in test_k8s.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from producer.cli.app import cli
from producer.ports import (
    CPU_PORT_OFFSET,
    DEFAULT_EXPORTER_PORT,
    DEFAULT_METRICS_PORT,
    metrics_port_for,
)
from producer.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((REPO / "docker/compose.yaml").read_text())[
        "services"]
    return services


def _scrape_configs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((REPO / "infra/prometheus/prometheus.yml").read_text())
    return {c["job_name"]: c for c in config["scrape_configs"]}


def _exposed(dockerfile: str) -> set[int]:
    text = (REPO / "docker" / dockerfile).read_text()
    return {int(p) for line in re.findall(r"^EXPOSE (.+)$", text, re.M) for p in line.split()}


def test_settings_defaults_are_the_rule_s() -> None:
    settings = Settings()
    assert settings.metrics_port == DEFAULT_METRICS_PORT
    assert settings.exporter_port == DEFAULT_EXPORTER_PORT
    # The exporter sits above the range of the largest host (8 GPUs) and below the CPU range.
    assert metrics_port_for(DEFAULT_METRICS_PORT, gpu=7) < DEFAULT_EXPORTER_PORT
    assert DEFAULT_EXPORTER_PORT < metrics_port_for(DEFAULT_METRICS_PORT, cpu=0)


def test_compose_gives_gpu_container_n_the_base_of_gpu_n() -> None:
    # A container sees its one GPU as index 0, so container N is told the port of GPU N.
    gpu_workers = {n: s for n, s in _compose().items() if re.fullmatch(r"worker-gpu\d+", n)}
    assert len(gpu_workers) == 8
    for name, service in gpu_workers.items():
        index = int(name.removeprefix("worker-gpu"))
        base = int(service["environment"]["FRAMEFLEET_METRICS_PORT"])
        assert metrics_port_for(base, gpu=0) == metrics_port_for(DEFAULT_METRICS_PORT, gpu=index)


def test_prometheus_scrapes_the_cpu_workers_above_the_gpu_range() -> None:
    # Each CPU container runs one CPU worker (slot 0) under its own name.
    cpu = {n: s for n, s in _compose().items() if re.fullmatch(r"worker-cpu\d+", n)}
    assert len(cpu) == 2
    workers = _scrape_configs()["framefleet-worker"]
    ports = {name: sd["port"] for sd in workers["dns_sd_configs"] for name in sd["names"]}
    for name, service in cpu.items():
        base = int(service["environment"].get("FRAMEFLEET_METRICS_PORT", DEFAULT_METRICS_PORT))
        assert service["command"] == ["worker", "--cpu", "1"]
        assert ports[name] == metrics_port_for(base, cpu=0) == base + CPU_PORT_OFFSET


def test_prometheus_scrapes_the_exporter_on_the_port_compose_gives_it() -> None:
    exporter = _compose()["exporter"]
    assert exporter["command"] == ["exporter"]
    port = int(exporter["environment"].get("FRAMEFLEET_EXPORTER_PORT", DEFAULT_EXPORTER_PORT))
    (static,) = _scrape_configs()["framefleet-exporter"]["static_configs"]
    assert static["targets"] == [f"exporter:{port}"]
    assert port == DEFAULT_EXPORTER_PORT


def test_images_expose_the_default_ports() -> None:
    assert metrics_port_for(DEFAULT_METRICS_PORT, gpu=0) in _exposed("Dockerfile.worker")
    assert DEFAULT_EXPORTER_PORT in _exposed("Dockerfile.producer")


def test_exporter_help_names_its_port_and_the_worker_rule() -> None:
    done = CliRunner().invoke(cli, ["exporter", "--help"], terminal_width=200)
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert f"FRAMEFLEET_EXPORTER_PORT (default {DEFAULT_EXPORTER_PORT})" in text
    assert f"FRAMEFLEET_METRICS_PORT (default {DEFAULT_METRICS_PORT}) + GPU index" in text
    assert f"FRAMEFLEET_METRICS_PORT + {CPU_PORT_OFFSET} + slot" in text


def test_the_settings_table_states_the_rule() -> None:
    rows = {
        match.group(1): (match.group(2), match.group(3))
        for match in re.finditer(r"^\| `(FRAMEFLEET_\w+)` \| ([^|]+) \| ([^|]+) \|$",
                                 (REPO / "docs" / "configuration.md").read_text(), re.M)
    }  # fmt: skip
    default, meaning = rows["FRAMEFLEET_METRICS_PORT"]
    assert default.strip() == str(DEFAULT_METRICS_PORT)
    assert f"+ {CPU_PORT_OFFSET} + *j*" in meaning and "+ *i*" in meaning
    default, meaning = rows["FRAMEFLEET_EXPORTER_PORT"]
    assert default.strip() == str(DEFAULT_EXPORTER_PORT) and "framefleet exporter" in meaning
