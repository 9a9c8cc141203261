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

import fnmatch
import re
import stat
import subprocess
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.require import require_binary

AWS = Path(__file__).resolve().parents[2] / "infra" / "aws"
TEMPLATES = sorted(AWS.glob("*.yaml"))
CFN_LINT = "cfn-lint (pip install cfn-lint)"
# Regions where cfn-lint's data lists G7e and that deploy.md recommends.
G7E_REGIONS = ("us-east-1", "us-east-2", "us-west-2")
GPUS = {"2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "12xlarge": 2, "24xlarge": 4, "48xlarge": 8}

# Parameter values a real deployment would pass (each is checked against AllowedPattern).
PARAMS = {
    "WorkerImage": "123456789012.dkr.ecr.us-east-2.amazonaws.com/framefleet-worker:0.1.0",
    "ProducerImage": "123456789012.dkr.ecr.us-east-2.amazonaws.com/framefleet-producer:0.1.0",
    "BucketName": "framefleet-test-output",
    "RedisHost": "master.framefleet.abc123.use2.cache.amazonaws.com",
    "RedisAuthTokenSecretArn": "arn:aws:secretsmanager:us-east-2:123456789012:secret:ff-AbCdEf",
}
PSEUDO = {
    "AWS::Region": "us-east-2",
    "AWS::StackName": "ff-test",
    "AWS::Partition": "aws",
    "AWS::AccountId": "123456789012",
    "LogGroup": "/framefleet/ff-test",
}
TOKEN = "0123456789abcdefABCDEF0123456789abcdefABCDEF0123456789abcdefABCD"


class _CfnLoader(yaml.SafeLoader):
    """A YAML loader that turns CloudFormation short tags (!Ref, !Sub ...) into long forms."""


def _intrinsic(loader: _CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        assert isinstance(node, yaml.MappingNode)
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _intrinsic)


def load(name: str) -> dict[str, Any]:
    """One template of infra/aws, intrinsic functions in their long form."""
    data: dict[str, Any] = yaml.load((AWS / name).read_text(), Loader=_CfnLoader)
    return data


def sub(text: str, names: Mapping[str, str]) -> str:
    """Render an Fn::Sub string: ${Name} from ``names``, ${!Literal} to ${Literal}."""

    def one(m: re.Match[str]) -> str:
        inner = m.group(1)
        if inner.startswith("!"):
            return "${" + inner[1:] + "}"
        assert inner in names, f"Fn::Sub refers to ${{{inner}}}, unknown to this test"
        return names[inner]

    return re.sub(r"\$\{([^}]*)\}", one, text)


def names_for(template: dict[str, Any], **overrides: str) -> dict[str, str]:
    """Values for Fn::Sub: parameter defaults, PARAMS, pseudo parameters, then overrides."""
    names = {k: str(p["Default"]) for k, p in template["Parameters"].items() if "Default" in p}
    names.update(PARAMS, **PSEUDO)
    names.update(overrides)
    for key, value in names.items():
        pattern = template["Parameters"].get(key, {}).get("AllowedPattern")
        assert pattern is None or re.fullmatch(pattern, value), f"{key}={value!r} not allowed"
    return names


def user_data(resource: str, **overrides: str) -> str:
    """The rendered user data of a launch template of fleet.yaml."""
    fleet = load("fleet.yaml")
    data = fleet["Resources"][resource]["Properties"]["LaunchTemplateData"]["UserData"]
    return sub(data["Fn::Base64"]["Fn::Sub"], names_for(fleet, **overrides))


# Stand-ins for the commands the scripts call; each records its argv (tab-separated) first.
SHIMS = {
    "nvidia-smi": 'for ((i = 0; i < FAKE_GPUS; i++)); do echo "GPU $i: RTX PRO 6000"; done',
    "docker": 'case "$1" in login) cat >/dev/null ;; ps) printf "%s\\n" $FAKE_DOCKER_PS ;; esac',
    "aws": f"""
        case "$1 $2" in
          "secretsmanager get-secret-value") echo {TOKEN} ;;
          "ecr get-login-password") echo ecr-password ;;
        esac""",
    # Instance metadata: the lifecycle state reads InService twice, then Terminated.
    "curl": """
        url="${@: -1}"
        case "$url" in
          */api/token) echo imds-token ;;
          */instance-life-cycle) echo "$FAKE_LIFECYCLE" ;;
          */instance-id) echo i-0123456789abcdef0 ;;
          */target-lifecycle-state)
            n=$(cat "$FAKE_LOG.polls" 2>/dev/null || echo 0)
            echo $((n + 1)) > "$FAKE_LOG.polls"
            if [ "$n" -ge 2 ]; then echo Terminated; else echo InService; fi ;;
          *) exit 22 ;;
        esac""",
    "hostname": "echo ip-10-0-1-23",
    "systemctl": "",
    "dnf": "",
    "sleep": "",
}


def run(
    script: str, tmp: Path, gpus: int = 0, lifecycle: str = "on-demand", ps: str = ""
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run ``script`` with bash, the stand-ins first on PATH; return it and the calls made."""
    bin_dir, root, log = tmp / "bin", tmp / "root", tmp / "calls.log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    root.mkdir(exist_ok=True)
    for name, body in SHIMS.items():
        shim = bin_dir / name
        # One write per call: the two ends of a pipe (aws ... | docker login) log concurrently.
        record = (
            'line=${0##*/}; for a in "$@"; do line+=$\'\\t\'$a; done; echo "$line" >> "$FAKE_LOG"'
        )
        shim.write_text(f"#!/bin/bash\n{record}\n{textwrap.dedent(body)}\n")
        shim.chmod(0o755)
    (tmp / "script.sh").write_text(script)
    env = dict(PATH=f"{bin_dir}:/usr/bin:/bin", FRAMEFLEET_ROOT=str(root), HOME=str(tmp))
    fakes = dict(FAKE_LOG=str(log), FAKE_GPUS=str(gpus), FAKE_LIFECYCLE=lifecycle)
    done = sh("bash", str(tmp / "script.sh"), env={**env, **fakes, "FAKE_DOCKER_PS": ps})
    calls = [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def option(call: list[str], name: str) -> list[str]:
    """Every value given to ``--name value`` in one recorded call."""
    return [call[i + 1] for i, arg in enumerate(call[:-1]) if arg == name]


def sh(*cmd: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its text output; the caller checks the exit status."""
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def cfn_lint(*args: str) -> subprocess.CompletedProcess[str]:
    exe = require_binary("cfn-lint", CFN_LINT)
    return sh(exe, "--format", "parseable", "--regions", *G7E_REGIONS, *args)


def test_every_template_passes_cfn_lint() -> None:
    assert {t.name for t in TEMPLATES} >= {"bucket.yaml", "redis.yaml", "fleet.yaml"}
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


# --- IAM -----------------------------------------------------------------------------------

S3_PREFIX = {"Fn::Sub": "arn:${AWS::Partition}:s3:::${BucketName}/${OutputPrefix}/*"}
LOG_GROUP = {"Fn::GetAtt": ["LogGroup", "Arn"]}
ECR_REPOS = {"Ref": "EcrRepositoryArns"}
GROUP_ARN = (
    "arn:${AWS::Partition}:autoscaling:${AWS::Region}:${AWS::AccountId}:autoScalingGroup:*"
    ":autoScalingGroupName/${AWS::StackName}-workers"
)
# Each action the fleet may use, and the one resource it may use it on (reviewed by hand).
ALLOWED: dict[str, Any] = {
    "s3:GetObject": S3_PREFIX,
    "s3:PutObject": S3_PREFIX,
    "cloudwatch:PutMetricData": "*",  # no resource-level permissions: namespace condition
    "ecr:GetAuthorizationToken": "*",  # no resource-level permissions at all
    "ecr:BatchGetImage": ECR_REPOS,
    "ecr:GetDownloadUrlForLayer": ECR_REPOS,
    "ecr:BatchCheckLayerAvailability": ECR_REPOS,
    "secretsmanager:GetSecretValue": {"Ref": "RedisAuthTokenSecretArn"},
    "logs:CreateLogStream": LOG_GROUP,
    "logs:PutLogEvents": LOG_GROUP,
    "autoscaling:CompleteLifecycleAction": {"Fn::Sub": GROUP_ARN},
}


def roles() -> Iterator[tuple[str, dict[str, Any]]]:
    for template in TEMPLATES:
        for name, res in load(template.name)["Resources"].items():
            if res["Type"].startswith("AWS::IAM::"):
                assert res["Type"] in {"AWS::IAM::Role", "AWS::IAM::InstanceProfile"}, name
                if res["Type"] == "AWS::IAM::Role":
                    yield name, res["Properties"]


def statements(role: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every statement a role could hold, both branches of each Fn::If."""
    for policy in role["Policies"]:
        for st in policy["PolicyDocument"]["Statement"]:
            branches = st["Fn::If"][1:] if "Fn::If" in st else [st]
            yield from (b for b in branches if b != {"Ref": "AWS::NoValue"})


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_iam_grants_nothing_beyond_the_allow_list() -> None:
    found = dict(roles())
    assert set(found) == {"WorkerRole", "ExporterRole"}
    for name, role in found.items():
        assert "ManagedPolicyArns" not in role, name
        trust = role["AssumeRolePolicyDocument"]["Statement"]
        assert [s["Principal"] for s in trust] == [{"Service": "ec2.amazonaws.com"}], name
        for st in statements(role):
            assert st["Effect"] == "Allow" and "NotAction" not in st and "NotResource" not in st
            for action in listed(st["Action"]):
                assert "*" not in action, f"{name}: wildcard action {action}"
                assert action in ALLOWED, f"{name}: unreviewed action {action}"
                assert listed(st["Resource"]) == [ALLOWED[action]], f"{name}: {action}"
                if action == "cloudwatch:PutMetricData":
                    assert st["Condition"] == {
                        "StringEquals": {"cloudwatch:namespace": "Framefleet"}
                    }
    s3 = {
        n: {a for st in statements(r) for a in listed(st["Action"]) if a.startswith("s3:")}
        for n, r in found.items()
    }
    assert s3 == {"WorkerRole": {"s3:GetObject", "s3:PutObject"}, "ExporterRole": set()}


def test_s3_grant_reaches_the_prefix_and_nothing_else() -> None:
    fleet = load("fleet.yaml")
    arn = sub(S3_PREFIX["Fn::Sub"], names_for(fleet))
    bucket = PARAMS["BucketName"]
    # IAM's "*" matches across "/", as fnmatch's does.
    assert fnmatch.fnmatchcase(f"arn:aws:s3:::{bucket}/videos/acme/job-1/segment-00000.mp4", arn)
    for outside in ("", "/other/x.mp4", "/videos", "-2/videos/x", "/videosx/y"):
        assert not fnmatch.fnmatchcase(f"arn:aws:s3:::{bucket}{outside}", arn), outside
    # The prefix parameter cannot widen the grant.
    for template in ("fleet.yaml", "bucket.yaml"):
        pattern = load(template)["Parameters"]["OutputPrefix"]["AllowedPattern"]
        for bad in ("", "*", "videos/*", "/videos", "videos/", "a//b", "v?deos"):
            assert not re.fullmatch(pattern, bad), (template, bad)
        assert re.fullmatch(pattern, "team-a/videos.v2")


# --- network, storage, broker, scaling -----------------------------------------------------


def test_nothing_is_reachable_from_outside() -> None:
    for template in TEMPLATES:
        for name, res in load(template.name)["Resources"].items():
            props = res.get("Properties", {})
            rules = props.get("SecurityGroupIngress", [])
            if res["Type"] == "AWS::EC2::SecurityGroupIngress":
                rules = [props]
            for rule in rules:
                assert "CidrIp" not in rule and "CidrIpv6" not in rule, f"{template.name} {name}"
                assert "SourceSecurityGroupId" in rule, f"{template.name} {name}"
    fleet = load("fleet.yaml")["Resources"]
    assert "SecurityGroupIngress" not in fleet["FleetSecurityGroup"]["Properties"]
    for lt in ("WorkerLaunchTemplate", "ExporterLaunchTemplate"):
        data = fleet[lt]["Properties"]["LaunchTemplateData"]
        assert "NetworkInterfaces" not in data  # so no AssociatePublicIpAddress either
        assert data["MetadataOptions"]["HttpTokens"] == "required"


def test_bucket_is_private_encrypted_and_expires_output() -> None:
    res = load("bucket.yaml")["Resources"]
    props = res["OutputBucket"]["Properties"]
    assert set(props["PublicAccessBlockConfiguration"].values()) == {True}
    rule = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in {"AES256", "aws:kms"}
    lifecycle = props["LifecycleConfiguration"]["Rules"]
    assert any("ExpirationInDays" in r and r["Status"] == "Enabled" for r in lifecycle)
    assert any("AbortIncompleteMultipartUpload" in r for r in lifecycle)
    deny = res["OutputBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"][0]
    assert deny["Effect"] == "Deny"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_redis_requires_tls_and_auth() -> None:
    res = load("redis.yaml")["Resources"]
    broker = res["Broker"]["Properties"]
    assert broker["TransitEncryptionEnabled"] is True
    assert broker["AtRestEncryptionEnabled"] is True
    assert broker["AuthToken"] == {"Fn::Sub": "{{resolve:secretsmanager:${AuthToken}}}"}
    assert res["AuthToken"]["Type"] == "AWS::SecretsManager::Secret"
    params = res["ParameterGroup"]["Properties"]["Properties"]
    assert params["maxmemory-policy"] == "noeviction"


def test_group_mixes_on_demand_and_spot_and_tracks_backlog_per_gpu() -> None:
    fleet = load("fleet.yaml")
    res = fleet["Resources"]
    group = res["WorkerGroup"]["Properties"]
    dist = group["MixedInstancesPolicy"]["InstancesDistribution"]
    assert dist["OnDemandBaseCapacity"] == {"Ref": "OnDemandBaseCapacity"}
    assert dist["SpotAllocationStrategy"] == "price-capacity-optimized"
    assert group["CapacityRebalance"] is True
    hook = group["LifecycleHookSpecificationList"][0]
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    tracking = res["BacklogPerGpuPolicy"]["Properties"]["TargetTrackingConfiguration"]
    metrics = {m["Id"]: m for m in tracking["CustomizedMetricSpecification"]["Metrics"]}
    queue = metrics["queue"]["MetricStat"]["Metric"]
    assert (queue["Namespace"], queue["MetricName"]) == ("Framefleet", "QueueDepth")
    assert queue["Dimensions"] == [{"Name": "Queue", "Value": {"Ref": "QueueName"}}]
    assert fleet["Parameters"]["QueueName"]["Default"] == "video"
    # The wake-up alarm watches the very same series.
    alarm = {m["Id"]: m for m in res["WakeFromZeroAlarm"]["Properties"]["Metrics"]}
    assert alarm["queue"]["MetricStat"]["Metric"] == queue
    # backlog / (instances x GPUs per instance), for each size.
    text, mapping = metrics["backlog_per_gpu"]["Expression"]["Fn::Sub"]
    assert mapping["Gpus"]["Fn::FindInMap"][0] == "G7e"
    for size, gpus in GPUS.items():
        assert sub(text, {"Gpus": str(gpus)}) == f"queue / (inservice * {gpus})", size
