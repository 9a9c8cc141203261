"""The AWS templates (infra/aws) as the tests read them: CloudFormation's YAML tags, Fn::Sub
rendering, user data run by bash against stand-in commands."""

from __future__ import annotations

import re
import subprocess
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    # api.yaml's own.
    "ApiKeysSecretArn": "arn:aws:secretsmanager:us-east-2:123456789012:secret:ff-api-keys-AbCd",
    "CertificateArn": "arn:aws:acm:us-east-2:123456789012:certificate/0f1e2d3c-4b5a-6978-8a9b",
    "VpcCidr": "10.20.0.0/16",
    "ClientCidr": "10.0.0.0/8",
    "WorkerRoleName": "ff-test-WorkerRole-ABC123",
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


def user_data(resource: str, template: str = "fleet.yaml", **overrides: str) -> str:
    """The rendered user data of a launch template (of fleet.yaml unless ``template`` says)."""
    loaded = load(template)
    data = loaded["Resources"][resource]["Properties"]["LaunchTemplateData"]["UserData"]
    return sub(data["Fn::Base64"]["Fn::Sub"], names_for(loaded, **overrides))


# Stand-ins for the commands the scripts call; each records its argv (tab-separated) first.
SHIMS = {
    "nvidia-smi": 'for ((i = 0; i < FAKE_GPUS; i++)); do echo "GPU $i: RTX PRO 6000"; done',
    # `docker exec NAME framefleet healthcheck`: a container in $FAKE_NOT_READY never passes,
    # every other one fails its first $FAKE_WARMING checks (warming up), then passes.
    "docker": """
        case "$1" in
          login) cat >/dev/null ;;
          ps) printf "%s\\n" $FAKE_DOCKER_PS ;;
          exec)
            case " $FAKE_NOT_READY " in *" $2 "*) exit 1 ;; esac
            n=$(cat "$FAKE_LOG.$2" 2>/dev/null || echo 0)
            echo $((n + 1)) > "$FAKE_LOG.$2"
            [ "$n" -ge "$FAKE_WARMING" ] ;;
        esac""",
    # The API keys secret answers $FAKE_API_KEYS (keys.toml); every other secret the token.
    "aws": f"""
        case "$1 $2" in
          "secretsmanager get-secret-value")
            case "$*" in
              *api-keys*) printf '%s\\n' "$FAKE_API_KEYS" ;;
              *) echo {TOKEN} ;;
            esac ;;
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
    # The model volume: `nvme id-ctrl --vendor-specific DEV` shows the device name EBS was
    # given for each pair dev=name of $FAKE_NVME_NAMES, padded as EBS pads it; blkid sees XFS
    # and lsblk the volume id (the NVMe serial); nothing is mounted yet.
    "nvme": """
        dev="${@: -1}"
        echo "vs[]:"
        for pair in $FAKE_NVME_NAMES; do
          if [ "${pair%%=*}" = "${dev##*/}" ]; then
            printf '0000: 2f 64 65 76 2f 73 64 6d 20 20 20 20 20 20 20 20 "/dev/%-8s"\n' \
              "${pair#*=}"
            exit 0
          fi
        done
        echo '0000: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 "................"'""",
    "blkid": 'case "$*" in *TYPE*) echo xfs ;; *) exit 2 ;; esac',
    "lsblk": "echo vol0123456789abcdef1",
    "mountpoint": "exit 1",
    "mount": "",
    "dd": "",  # reads nothing: the calls say which files were read through
    "hostname": "echo ip-10-0-1-23",
    "systemctl": "",
    "chown": "",  # the tests need not run as root
    "dnf": "",
    "sleep": "",
}


def run(
    script: str, tmp: Path, gpus: int = 0, lifecycle: str = "on-demand", ps: str = "",
    api_keys: str = "", warming: int = 0, not_ready: str = "", ready_wait_s: int | None = None,
    nvme_names: str = "",
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run ``script`` with bash, the stand-ins first on PATH; return it and the calls made.

    ``warming``: healthchecks each worker container fails before it passes; ``not_ready``:
    container names that never pass; ``ready_wait_s``: the boot script's wait for ready
    (unset: its own, from the ready hook's timeout and the uptime); ``nvme_names``:
    ``nvme1n1=sdm ...``, the EBS device name in each NVMe device's vendor data."""
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
    fakes = dict(FAKE_LOG=str(log), FAKE_GPUS=str(gpus), FAKE_LIFECYCLE=lifecycle,
                 FAKE_API_KEYS=api_keys, FAKE_WARMING=str(warming), FAKE_NOT_READY=not_ready,
                 FAKE_NVME_NAMES=nvme_names)
    if ready_wait_s is not None:
        env["FRAMEFLEET_READY_WAIT_S"] = str(ready_wait_s)
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
