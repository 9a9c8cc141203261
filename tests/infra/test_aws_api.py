"""The gateway's AWS deployment (infra/aws/api.yaml), checked without an AWS account:

- the load balancer serves HTTPS only, forwards to the gateway's port, and its target group
  checks the readiness route;
- the boot script, rendered as CloudFormation renders it and run by bash against stand-in
  commands, writes the keys file (hashes only, the gateway's user's), the model map and a
  root-only settings file that the gateway's own settings accept, and starts one container;
- the keys refresher replaces the file only when the secret changed (the gateway re-reads it);
- a real gateway, given the settings and files the boot script wrote (Redis and the store
  swapped for the test's), answers the target group's health check path with 200.

cfn-lint and the IAM and network rules cover api.yaml with the other templates
(test_aws.py, test_aws_policies.py).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import urllib.request
from pathlib import Path
from typing import Any

from producer.api.catalog import load_catalog
from producer.settings import Settings
from tests.gateway import GatewayProcess, write_keys
from tests.infra.aws_templates import PARAMS, TOKEN, load, option, run, sh, user_data
from tests.require import require_binary
from tests.services import S3Server

API = load("api.yaml")
RES = API["Resources"]


def test_the_load_balancer_checks_readiness_and_serves_https_only() -> None:
    group = RES["TargetGroup"]["Properties"]
    assert (group["HealthCheckPath"], group["Port"], group["Protocol"]) == ("/readyz", 8000,
                                                                            "HTTP")
    assert group["Matcher"] == {"HttpCode": "200"}
    listeners = [r["Properties"] for r in RES.values()
                 if r["Type"] == "AWS::ElasticLoadBalancingV2::Listener"]
    assert len(listeners) == 1
    (https,) = listeners
    assert (https["Protocol"], https["Port"]) == ("HTTPS", 443)
    assert https["Certificates"] == [{"CertificateArn": {"Ref": "CertificateArn"}}]
    assert https["DefaultActions"] == [{"Type": "forward",
                                        "TargetGroupArn": {"Ref": "TargetGroup"}}]
    asg = RES["GatewayGroup"]["Properties"]
    assert asg["TargetGroupARNs"] == [{"Ref": "TargetGroup"}]
    assert asg["VPCZoneIdentifier"] == {"Ref": "SubnetIds"}
    # The idle timeout outlasts the event streams' keep-alive comments.
    attrs = {a["Key"]: a["Value"] for a in
             RES["LoadBalancer"]["Properties"]["LoadBalancerAttributes"]}
    assert int(attrs["idle_timeout.timeout_seconds"]) > 15
    assert attrs["routing.http.drop_invalid_header_fields.enabled"] == "true"


def boot(tmp_path: Path, keys_toml: str) -> tuple[Path, list[list[str]]]:
    """Run the gateway's user data; returns the instance's root and the calls made."""
    done, calls = run(user_data("GatewayLaunchTemplate", "api.yaml"), tmp_path, api_keys=keys_toml)
    assert done.returncode == 0, done.stderr
    return tmp_path / "root", calls


def env_file(root: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (root / "etc/framefleet/api.env").read_text()
                .splitlines())


def test_the_boot_script_starts_the_gateway_with_its_settings(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "k.toml", {"acme": {}})
    keys_toml = (tmp_path / "k.toml").read_text().strip()
    root, calls = boot(tmp_path, keys_toml)
    api = root / "etc/framefleet/api"
    # The keys file: as the secret holds it (hashes, no key), for the gateway's user only.
    assert (api / "keys.toml").read_text().strip() == keys_toml
    assert keys["acme"].secret not in (api / "keys.toml").read_text()
    assert stat.S_IMODE((api / "keys.toml").stat().st_mode) == 0o400
    chown = [c for c in calls if c[0] == "chown"]
    assert chown and chown[0][1] == "10001:10001"
    # The model map: the parameter's JSON, a map the gateway loads.
    models = json.loads(API["Parameters"]["ModelsJson"]["Default"])
    assert json.loads((api / "models.json").read_text()) == models
    assert set(load_catalog(str(api / "models.json")).models) == set(models["models"])
    # The settings: root-only, each one a setting the gateway accepts with its range checks.
    assert stat.S_IMODE((root / "etc/framefleet/api.env").stat().st_mode) == 0o600
    env = env_file(root)
    settings = Settings(**{k.removeprefix("FRAMEFLEET_").lower(): v for k, v in env.items()
                           if k.startswith("FRAMEFLEET_")})
    assert settings.api_trusted_proxy_list == [PARAMS["VpcCidr"]]
    assert settings.output_prefix == f"s3://{PARAMS['BucketName']}/videos"
    assert settings.api_input_prefix == f"s3://{PARAMS['BucketName']}/inputs"
    assert (settings.api_rate_per_minute, settings.api_anon_rate_per_minute,
            settings.api_max_in_flight, settings.api_max_streams) == (600, 120, 16, 8)
    assert f":{TOKEN}@{PARAMS['RedisHost']}:6379/" in env["FRAMEFLEET_BROKER_URL"]
    # One container: the image's `api` command, on 8000, read-only, the folder mounted.
    runs = [c for c in calls if c[:2] == ["docker", "run"]]
    assert len(runs) == 1
    image = "123456789012.dkr.ecr.us-east-2.amazonaws.com/framefleet-producer:0.1.0"
    assert runs[0][runs[0].index(image):] == [image, "api"]
    assert option(runs[0], "--publish") == ["8000:8000"] and "--read-only" in runs[0]
    assert option(runs[0], "--volume") == [f"{api}:/etc/framefleet/api:ro"]
    assert env["FRAMEFLEET_API_KEYS_FILE"] == "/etc/framefleet/api/keys.toml"
    assert ["systemctl", "enable", "--now", "framefleet-api-keys.timer"] in calls


def test_the_keys_refresher_replaces_the_file_only_when_the_secret_changed(
        tmp_path: Path) -> None:
    root, _ = boot(tmp_path / "boot", "[[keys]] # first")
    keys_file = root / "etc/framefleet/api/keys.toml"
    refresher = (root / "usr/local/bin/framefleet-api-keys").read_text()
    first = keys_file.stat()
    done, _ = run(refresher, tmp_path / "same", api_keys="[[keys]] # first")
    assert done.returncode == 0, done.stderr
    assert keys_file.stat().st_ino == first.st_ino  # unchanged: not rewritten
    done, _ = run(refresher, tmp_path / "rotated", api_keys="[[keys]] # rotated")
    assert done.returncode == 0, done.stderr
    assert keys_file.read_text() == "[[keys]] # rotated\n"
    assert keys_file.stat().st_ino != first.st_ino  # a new file, renamed into place
    done, _ = run(refresher, tmp_path / "empty", api_keys="")  # a failed read keeps the last
    assert keys_file.read_text() == "[[keys]] # rotated\n"
    assert [p.name for p in keys_file.parent.iterdir() if p.name.startswith(".keys")] == []


def test_the_refresher_and_boot_script_pass_shellcheck(tmp_path: Path) -> None:
    exe = require_binary("shellcheck", "the shellcheck package (apt-get install shellcheck)")
    root, _ = boot(tmp_path / "boot", "x")
    for name, text in {"boot": user_data("GatewayLaunchTemplate", "api.yaml"),
                       "keys": (root / "usr/local/bin/framefleet-api-keys").read_text()}.items():
        (tmp_path / f"{name}.sh").write_text(text)
        done = sh(exe, "--shell=bash", str(tmp_path / f"{name}.sh"))
        assert done.returncode == 0, f"{name}:\n{done.stdout}"


def test_a_gateway_from_the_templates_settings_answers_the_health_check(
        tmp_path: Path, redis_url: str, s3: S3Server) -> None:
    keys = write_keys(tmp_path / "k.toml", {"acme": {}})
    root, _ = boot(tmp_path / "boot", (tmp_path / "k.toml").read_text().strip())
    env: dict[str, Any] = env_file(root)
    bucket = f"ff-aws-{secrets.token_hex(4)}"
    s3.client().create_bucket(Bucket=bucket)
    # The instance's settings, with Redis, the store and the mounted folder swapped for the
    # test's own (loopback, no TLS): the rest is as the template wrote it.
    api = root / "etc/framefleet/api"
    env |= {"FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
            "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url, "FRAMEFLEET_S3_REGION": s3.region,
            "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{bucket}/videos",
            "FRAMEFLEET_API_INPUT_PREFIX": f"s3://{bucket}/inputs",
            "FRAMEFLEET_API_KEYS_FILE": str(api / "keys.toml"),
            "FRAMEFLEET_API_MODELS_FILE": str(api / "models.json")}
    os.chmod(api / "keys.toml", 0o600)  # this test's user reads it (on EC2: uid 10001)
    gateway = GatewayProcess(tmp_path, env, name="aws-gateway")
    try:
        gateway.start()

        path = RES["TargetGroup"]["Properties"]["HealthCheckPath"]
        with urllib.request.urlopen(gateway.url + path, timeout=10) as r:
            assert r.status == 200 and json.loads(r.read()) == {"status": "ready"}
        req = urllib.request.Request(gateway.url + "/v1/videos", headers=keys["acme"].headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["object"] == "list"
    finally:
        gateway.stop()
