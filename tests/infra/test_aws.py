"""The AWS deployment (infra/aws), checked without an AWS account.

- cfn-lint validates every template for the regions that offer G7e, and a probe shows that it
  knows each G7e size the fleet allows (and rejects a made-up one);
- the worker and exporter user data are rendered as CloudFormation's Fn::Sub renders them, then
  run by bash against stand-in commands (nvidia-smi, docker, aws, curl ...) that record their
  calls: one worker container per GPU for 1, 2, 4 and 8 GPUs; the "ready" launch hook completed
  with CONTINUE once every container's healthcheck passes, with ABANDON when one never does
  or the boot fails;
- the IAM policies are parsed and held to a reviewed allow-list: S3 only Get/PutObject under the
  bucket prefix, "*" only for the two actions that AWS offers no resource scoping for.
"""

from __future__ import annotations

import re
import stat
import time
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
from worker.lifecycle.poolwatch import WARM_START_S


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
    # and it installs the drain service,
    assert ["systemctl", "enable", "--now", "framefleet-drain.service"] in calls
    # then puts the instance in service, every worker being ready.
    assert [_result(c) for c in _completions(calls)] == ["CONTINUE"]


def _hook(name: str) -> dict[str, Any]:
    group = load("fleet.yaml")["Resources"]["WorkerGroup"]["Properties"]
    (hook,) = [h for h in group["LifecycleHookSpecificationList"]
               if h["LifecycleHookName"] == name]
    return hook


def _completions(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if c[:3] == ["aws", "autoscaling", "complete-lifecycle-action"]]


def _result(call: list[str]) -> str:
    """The result of a completion of the "ready" hook (and check that it is that hook)."""
    group = load("fleet.yaml")["Resources"]["WorkerGroup"]["Properties"]
    assert option(call, "--auto-scaling-group-name") == [
        sub(group["AutoScalingGroupName"]["Fn::Sub"], PSEUDO)
    ]
    assert option(call, "--lifecycle-hook-name") == [_hook("ready")["LifecycleHookName"]]
    assert option(call, "--instance-id") == ["i-0123456789abcdef0"]
    (result,) = option(call, "--lifecycle-action-result")
    return result


def test_the_instance_goes_in_service_once_every_worker_is_ready(tmp_path: Path) -> None:
    # Given two workers that each fail their first three healthchecks (warming up),
    done, calls = run(user_data("WorkerLaunchTemplate"), tmp_path, gpus=2, warming=3,
                      ready_wait_s=600)
    assert done.returncode == 0, done.stderr
    # the boot script asks each container, in the container, until both pass,
    checks = [c for c in calls if c[:2] == ["docker", "exec"]]
    assert {tuple(c[2:]) for c in checks} == {
        (f"framefleet-worker-{i}", "framefleet", "healthcheck", "--timeout", "10")
        for i in range(2)
    }
    assert len(checks) == 2 * 4
    # and only then completes the launch hook with CONTINUE.
    (completion,) = _completions(calls)
    assert _result(completion) == "CONTINUE"
    assert calls.index(completion) > max(i for i, c in enumerate(calls) if c in checks)
    assert "every worker is ready" in done.stdout


def test_an_instance_whose_worker_never_gets_ready_is_abandoned(tmp_path: Path) -> None:
    # Given a host whose second worker never passes its healthcheck, and a 2 s deadline,
    started = time.monotonic()
    done, calls = run(user_data("WorkerLaunchTemplate"), tmp_path, gpus=2,
                      not_ready="framefleet-worker-1", ready_wait_s=2)
    # the boot script gives the instance up once the deadline has passed, saying which one,
    assert time.monotonic() - started < 60
    assert done.returncode != 0
    assert "abandoning this instance" in done.stderr
    assert "framefleet-worker-1" in done.stderr.split("abandoning")[0]
    assert "framefleet-worker-0" not in done.stderr
    # and completes the launch hook once, with ABANDON: Auto Scaling launches another.
    assert [_result(c) for c in _completions(calls)] == ["ABANDON"]


def test_the_ready_hook_holds_a_launch_for_the_cold_start() -> None:
    fleet = load("fleet.yaml")
    hook = _hook("ready")
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    # A host that never reports ready (the script gone too) is replaced, not put in service.
    assert hook["DefaultResult"] == "ABANDON"
    assert hook["HeartbeatTimeout"] == {"Ref": "ReadyTimeoutSeconds"}
    timeout = fleet["Parameters"]["ReadyTimeoutSeconds"]
    # The worker's own start bound with a warm-up (a cold model folder and cold compiles),
    # with room for the boot and the image pull; within the hook's limit of two hours.
    assert timeout["Default"] > WARM_START_S + 300
    assert timeout["MaxValue"] <= 7200
    # The instance is in service only once ready: the warm-up and the grace period start there.
    group = fleet["Resources"]["WorkerGroup"]["Properties"]
    assert group["DefaultInstanceWarmup"] <= 120
    assert group["HealthCheckGracePeriod"] <= 120


def test_worker_user_data_fails_loudly_without_gpu(tmp_path: Path) -> None:
    done, calls = run(user_data("WorkerLaunchTemplate"), tmp_path, gpus=0)
    assert done.returncode != 0
    assert "no GPU" in done.stderr
    assert not [c for c in calls if c[:2] == ["docker", "run"]]
    # and gives the instance up at once rather than after the ready hook's timeout.
    assert [_result(c) for c in _completions(calls)] == ["ABANDON"]


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
    hook = _hook("drain")
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert option(release, "--lifecycle-hook-name") == [hook["LifecycleHookName"]]
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
        # its model volume branch, with the parameters' values spliced in
        "worker-models": user_data(
            "WorkerLaunchTemplate", ModelSnapshotId="snap-0123456789abcdef0",
            ModelWarmupFolder="Wan2.2-TI2V-5B-Diffusers", WarmupGenerateSizes="704x1280x121",
        ),
        "exporter": user_data("ExporterLaunchTemplate"),
        "drain": (tmp_path / "root/usr/local/bin/framefleet-drain").read_text(),
    }
    for name, text in scripts.items():
        (tmp_path / f"{name}.sh").write_text(text)
        done = sh(exe, "--shell=bash", str(tmp_path / f"{name}.sh"))
        assert done.returncode == 0, f"{name}:\n{done.stdout}"
