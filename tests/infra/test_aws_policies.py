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
S3_INPUTS = {"Fn::Sub": "arn:${AWS::Partition}:s3:::${BucketName}/${InputPrefix}/*"}
S3_BUCKET = {"Fn::Sub": "arn:${AWS::Partition}:s3:::${BucketName}"}
LOG_GROUP = {"Fn::GetAtt": ["LogGroup", "Arn"]}
ECR_REPOS = {"Ref": "EcrRepositoryArns"}
GROUP_ARN = (
    "arn:${AWS::Partition}:autoscaling:${AWS::Region}:${AWS::AccountId}:autoScalingGroup:*"
    ":autoScalingGroupName/${AWS::StackName}-workers"
)
# Each action the fleet may use, and the resources it may use it on (reviewed by hand).
ALLOWED: dict[str, list[Any]] = {
    "s3:GetObject": [S3_PREFIX, S3_INPUTS],  # inputs: the workers read what the API takes
    "s3:PutObject": [S3_PREFIX, S3_INPUTS],  # inputs: the API's uploads
    "s3:DeleteObject": [S3_PREFIX, S3_INPUTS],  # the API's DELETE of a finished job
    "s3:ListBucket": [S3_BUCKET],  # the API's, conditioned on its two prefixes
    "cloudwatch:PutMetricData": ["*"],  # no resource-level permissions: namespace condition
    "ecr:GetAuthorizationToken": ["*"],  # no resource-level permissions at all
    "ecr:BatchGetImage": [ECR_REPOS],
    "ecr:GetDownloadUrlForLayer": [ECR_REPOS],
    "ecr:BatchCheckLayerAvailability": [ECR_REPOS],
    "secretsmanager:GetSecretValue": [{"Ref": "RedisAuthTokenSecretArn"},
                                      {"Ref": "ApiKeysSecretArn"}],
    "logs:CreateLogStream": [LOG_GROUP],
    "logs:PutLogEvents": [LOG_GROUP],
    "autoscaling:CompleteLifecycleAction": [{"Fn::Sub": GROUP_ARN}],
}
# What each role (or attached policy) holds of S3: exactly these actions on these resources.
S3_GRANTS = {
    "WorkerRole": {("s3:GetObject", str(S3_PREFIX)), ("s3:PutObject", str(S3_PREFIX))},
    "ExporterRole": set(),
    "GatewayRole": {("s3:GetObject", str(S3_PREFIX)), ("s3:PutObject", str(S3_INPUTS)),
                    ("s3:DeleteObject", str(S3_PREFIX)), ("s3:DeleteObject", str(S3_INPUTS)),
                    ("s3:ListBucket", str(S3_BUCKET))},
    "WorkersReadInputs": {("s3:GetObject", str(S3_INPUTS))},
}


def roles() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every role's properties, and every policy attached to a role from outside it."""
    for template in TEMPLATES:
        for name, res in load(template.name)["Resources"].items():
            if res["Type"].startswith("AWS::IAM::"):
                assert res["Type"] in {"AWS::IAM::Role", "AWS::IAM::InstanceProfile",
                                       "AWS::IAM::Policy"}, name
                if res["Type"] == "AWS::IAM::Role":
                    yield name, res["Properties"]
                if res["Type"] == "AWS::IAM::Policy":
                    yield name, {"Policies": [res["Properties"]]}


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
    assert set(found) == set(S3_GRANTS)
    for name, role in found.items():
        assert "ManagedPolicyArns" not in role, name
        if "AssumeRolePolicyDocument" in role:
            trust = role["AssumeRolePolicyDocument"]["Statement"]
            assert [s["Principal"] for s in trust] == [{"Service": "ec2.amazonaws.com"}], name
        for st in statements(role):
            assert st["Effect"] == "Allow" and "NotAction" not in st and "NotResource" not in st
            for action in listed(st["Action"]):
                assert "*" not in action, f"{name}: wildcard action {action}"
                assert action in ALLOWED, f"{name}: unreviewed action {action}"
                for resource in listed(st["Resource"]):
                    assert resource in ALLOWED[action], f"{name}: {action} on {resource}"
                if action == "cloudwatch:PutMetricData":
                    assert st["Condition"] == {
                        "StringEquals": {"cloudwatch:namespace": "Framefleet"}
                    }
                if action == "s3:ListBucket":  # the bucket, but only the two prefixes
                    assert st["Condition"] == {"StringLike": {"s3:prefix": [
                        {"Fn::Sub": "${OutputPrefix}/*"}, {"Fn::Sub": "${InputPrefix}/*"}]}}
    s3 = {
        n: {(a, str(res)) for st in statements(r) for a in listed(st["Action"])
            if a.startswith("s3:") for res in listed(st["Resource"])}
        for n, r in found.items()
    }
    assert s3 == S3_GRANTS
    # The attached policy goes to the worker role named by fleet.yaml's output, only.
    attached = load("api.yaml")["Resources"]["WorkersReadInputs"]["Properties"]
    assert attached["Roles"] == [{"Ref": "WorkerRoleName"}]
    assert load("fleet.yaml")["Outputs"]["WorkerRoleName"]["Value"] == {"Ref": "WorkerRole"}


def test_s3_grant_reaches_the_prefix_and_nothing_else() -> None:
    fleet = load("fleet.yaml")
    arn = sub(S3_PREFIX["Fn::Sub"], names_for(fleet))
    bucket = PARAMS["BucketName"]
    # IAM's "*" matches across "/", as fnmatch's does.
    assert fnmatch.fnmatchcase(f"arn:aws:s3:::{bucket}/videos/acme/job-1/segment-00000.mp4", arn)
    for outside in ("", "/other/x.mp4", "/videos", "-2/videos/x", "/videosx/y"):
        assert not fnmatch.fnmatchcase(f"arn:aws:s3:::{bucket}{outside}", arn), outside
    # The prefix parameters cannot widen the grants.
    for template, param in (("fleet.yaml", "OutputPrefix"), ("bucket.yaml", "OutputPrefix"),
                            ("api.yaml", "OutputPrefix"), ("api.yaml", "InputPrefix")):
        pattern = load(template)["Parameters"][param]["AllowedPattern"]
        for bad in ("", "*", "videos/*", "/videos", "videos/", "a//b", "v?deos"):
            assert not re.fullmatch(pattern, bad), (template, param, bad)
        assert re.fullmatch(pattern, "team-a/videos.v2")


# --- network, storage, broker, scaling -----------------------------------------------------


# The one door in: the API's load balancer, HTTPS, from the ClientCidr parameter.
DOOR = {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "CidrIp": {"Ref": "ClientCidr"},
        "Description": "HTTPS from the API's clients"}


def test_nothing_is_reachable_from_outside_but_the_apis_https() -> None:
    for template in TEMPLATES:
        for name, res in load(template.name)["Resources"].items():
            props = res.get("Properties", {})
            rules = props.get("SecurityGroupIngress", [])
            if res["Type"] == "AWS::EC2::SecurityGroupIngress":
                rules = [props]
            for rule in rules:
                if (template.name, name) == ("api.yaml", "LoadBalancerSecurityGroup"):
                    assert rule == DOOR
                    continue
                assert "CidrIp" not in rule and "CidrIpv6" not in rule, f"{template.name} {name}"
                assert "SourceSecurityGroupId" in rule, f"{template.name} {name}"
    fleet = load("fleet.yaml")["Resources"]
    assert "SecurityGroupIngress" not in fleet["FleetSecurityGroup"]["Properties"]
    api = load("api.yaml")["Resources"]
    assert "SecurityGroupIngress" not in api["GatewaySecurityGroup"]["Properties"]
    # The gateway instances: from the load balancer's group, on the gateway's port, only.
    door = api["GatewayFromLoadBalancer"]["Properties"]
    assert door["GroupId"] == {"Ref": "GatewaySecurityGroup"}
    assert door["SourceSecurityGroupId"] == {"Ref": "LoadBalancerSecurityGroup"}
    assert (door["FromPort"], door["ToPort"]) == (8000, 8000)
    launch_templates = (("fleet.yaml", "WorkerLaunchTemplate"),
                        ("fleet.yaml", "ExporterLaunchTemplate"),
                        ("api.yaml", "GatewayLaunchTemplate"))
    for tpl, lt in launch_templates:
        data = load(tpl)["Resources"][lt]["Properties"]["LaunchTemplateData"]
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
    hooks = {h["LifecycleHookName"]: h["LifecycleTransition"]
             for h in group["LifecycleHookSpecificationList"]}
    assert hooks == {"ready": "autoscaling:EC2_INSTANCE_LAUNCHING",
                     "drain": "autoscaling:EC2_INSTANCE_TERMINATING"}
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
