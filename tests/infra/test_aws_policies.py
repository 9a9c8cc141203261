"""The AWS deployment's IAM, network, storage, broker and scaling, held to reviewed rules."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from typing import Any

from tests.infra.aws_templates import (
    GPUS,
    PARAMS,
    TEMPLATES,
    load,
    names_for,
    sub,
)

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
