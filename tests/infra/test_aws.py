"""The AWS deployment (infra/aws), checked without an AWS account.

- cfn-lint validates every template for the regions that offer G7e, and a probe shows that it
  knows each G7e size the fleet allows (and rejects a made-up one);
- the worker and exporter user data are rendered as CloudFormation's Fn::Sub renders them, then
  run by bash against stand-in commands (nvidia-smi, docker, aws, curl ...) that record their
  calls: one worker container per GPU for 1, 2, 4 and 8 GPUs;
- the IAM policies are parsed and held to a reviewed allow-list: S3 only Get/PutObject under the
  bucket prefix, "*" only for the two actions that AWS offers no resource scoping for.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.infra.aws_templates import (
    GPUS,
    PARAMS,
    PSEUDO,
    TEMPLATES,
    TOKEN,
    cfn_lint,
    load,
    option,
    run,
    sh,
    sub,
    user_data,
)
from tests.require import require_binary


def test_every_template_passes_cfn_lint() -> None:
    assert {t.name for t in TEMPLATES} >= {"bucket.yaml", "redis.yaml", "fleet.yaml", "api.yaml"}
    done = cfn_lint("--", *map(str, TEMPLATES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_cfn_lint_knows_exactly_the_g7e_sizes_the_fleet_allows(tmp_path: Path) -> None:
    # cfn-lint checks literal instance types per region (E3628), not parameter values, so a
    # probe template names each allowed size literally, plus one that does not exist.
    allowed = load("fleet.yaml")["Parameters"]["InstanceType"]["AllowedValues"]
    probe: dict[str, Any] = {"AWSTemplateFormatVersion": "2010-09-09", "Resources": {}}
    for i, size in enumerate([*allowed, "g7e.96xlarge"]):
        probe["Resources"][f"Probe{i}"] = {
            "Type": "AWS::EC2::LaunchTemplate",
            "Properties": {"LaunchTemplateData": {"InstanceType": size}},
        }
    (tmp_path / "probe.yaml").write_text(yaml.safe_dump(probe))
    done = cfn_lint("--", str(tmp_path / "probe.yaml"))
    rejected = set(re.findall(r"'(g7e\.\w+)' is not one of", done.stdout))
    assert rejected == {"g7e.96xlarge"}, done.stdout[:2000]
    known = set(re.findall(r"'(g7e\.\w+)'", done.stdout)) - rejected
    assert known == set(allowed)
    # and the GPUs per size that the scaling metric divides by cover each of them.
    mapping = load("fleet.yaml")["Mappings"]["G7e"]
    assert {size: row["Gpus"] for size, row in mapping.items()} == {
        f"g7e.{s}": n for s, n in GPUS.items()
    }


@pytest.mark.parametrize(
    ("gpus", "lifecycle"), [(1, "on-demand"), (2, "spot"), (4, "on-demand"), (8, "spot")]
)
def test_worker_user_data_starts_one_container_per_gpu(
    tmp_path: Path, gpus: int, lifecycle: str
) -> None:
    # Given an instance whose nvidia-smi lists `gpus` GPUs, when the boot script runs,
    done, calls = run(user_data("WorkerLaunchTemplate"), tmp_path, gpus, lifecycle)
    assert done.returncode == 0, done.stderr
    # then it starts exactly one worker container per GPU, each pinned to its own device,
    image = PARAMS["WorkerImage"]
    runs = [c for c in calls if c[:2] == ["docker", "run"]]
    assert len(runs) == gpus
    for call in runs:
        assert call[call.index(image) :] == [image, "worker", "--gpus", "all"], call
    opts = [c[: c.index(image)] for c in runs]  # docker's own options, not the worker's
    devices = sorted(option(o, "--gpus")[0] for o in opts)
    assert devices == sorted(f"device={i}" for i in range(gpus))
    for o in opts:
        port = 9400 + int(option(o, "--gpus")[0].removeprefix("device="))
        assert option(o, "--publish") == [f"{port}:{port}"]
        assert f"FRAMEFLEET_METRICS_PORT={port}" in option(o, "--env")
        assert option(o, "--restart") == ["unless-stopped"]
    assert len({option(o, "--hostname")[0] for o in opts}) == gpus
    # after logging in to ECR and pulling the image once,
    login = ["docker", "login", "--username", "AWS", "--password-stdin"]
    assert [*login, image.split("/")[0]] in calls
    assert sum(c[:2] == ["docker", "pull"] for c in calls) == 1
    # with the broker credentials in a root-only env file,
    env_file = tmp_path / "root/etc/framefleet/worker.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    redis = f"rediss://:{TOKEN}@{PARAMS['RedisHost']}:6379"
    assert env["FRAMEFLEET_BROKER_URL"] == f"{redis}/0?ssl_cert_reqs=required"
    assert env["FRAMEFLEET_RESULT_BACKEND"] == f"{redis}/1?ssl_cert_reqs=required"
    assert env["FRAMEFLEET_OUTPUT_PREFIX"] == f"s3://{PARAMS['BucketName']}/videos"
    assert env["FRAMEFLEET_CAPACITY"] == lifecycle  # prices the cost reports
    assert "FRAMEFLEET_S3_ENDPOINT_URL" not in env  # real S3 on AWS
    # and it installs the drain service.
    assert ["systemctl", "enable", "--now", "framefleet-drain.service"] in calls


def test_worker_user_data_fails_loudly_without_gpu(tmp_path: Path) -> None:
    done, calls = run(user_data("WorkerLaunchTemplate"), tmp_path, gpus=0)
    assert done.returncode != 0
    assert "no GPU" in done.stderr
    assert not [c for c in calls if c[:2] == ["docker", "run"]]


def test_drain_finishes_jobs_then_releases_the_lifecycle_hook(tmp_path: Path) -> None:
    # Given a booted worker instance with two containers,
    boot, _ = run(user_data("WorkerLaunchTemplate"), tmp_path / "boot", gpus=2)
    assert boot.returncode == 0, boot.stderr
    drain = (tmp_path / "boot/root/usr/local/bin/framefleet-drain").read_text()
    # when instance metadata turns from InService to Terminated,
    done, calls = run(drain, tmp_path / "drain", ps="c0ffee01 c0ffee02")
    assert done.returncode == 0, done.stderr
    names = [c[0] for c in calls]
    # then it stops the workers gracefully (SIGTERM, then wait), and only then lets go.
    stop = names.index("docker", names.index("docker") + 1)  # after `docker ps`
    assert calls[stop] == ["docker", "stop", "--time", "840", "c0ffee01", "c0ffee02"]
    release = calls[-1]
    assert release[:3] == ["aws", "autoscaling", "complete-lifecycle-action"]
    assert stop < len(calls) - 1
    group = load("fleet.yaml")["Resources"]["WorkerGroup"]["Properties"]
    assert option(release, "--auto-scaling-group-name") == [
        sub(group["AutoScalingGroupName"]["Fn::Sub"], PSEUDO)
    ]
    assert option(release, "--lifecycle-hook-name") == [
        group["LifecycleHookSpecificationList"][0]["LifecycleHookName"]
    ]
    assert option(release, "--instance-id") == ["i-0123456789abcdef0"]


def test_exporter_user_data_starts_the_cloudwatch_exporter(tmp_path: Path) -> None:
    done, calls = run(user_data("ExporterLaunchTemplate"), tmp_path)
    assert done.returncode == 0, done.stderr
    runs = [c for c in calls if c[:2] == ["docker", "run"]]
    assert len(runs) == 1
    image = PARAMS["ProducerImage"]
    assert runs[0][runs[0].index(image) :] == [image, "exporter", "--cloudwatch"]
    assert "--gpus" not in runs[0]
    assert ["dnf", "install", "-y", "docker"] in calls


def test_rendered_scripts_pass_shellcheck(tmp_path: Path) -> None:
    exe = require_binary("shellcheck", "the shellcheck package (apt-get install shellcheck)")
    boot, _ = run(user_data("WorkerLaunchTemplate"), tmp_path, gpus=1)
    assert boot.returncode == 0, boot.stderr
    scripts = {
        "worker": user_data("WorkerLaunchTemplate"),
        "exporter": user_data("ExporterLaunchTemplate"),
        "drain": (tmp_path / "root/usr/local/bin/framefleet-drain").read_text(),
    }
    for name, text in scripts.items():
        (tmp_path / f"{name}.sh").write_text(text)
        done = sh(exe, "--shell=bash", str(tmp_path / f"{name}.sh"))
        assert done.returncode == 0, f"{name}:\n{done.stdout}"
