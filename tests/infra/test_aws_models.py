"""fleet.yaml's optional model volume: an EBS volume restored from ``ModelSnapshotId`` at each
launch, found by its device name, mounted read-only and handed to every worker with the warm-up
settings; without a snapshot, nothing of it. The boot script runs against the stand-in commands
of ``tests/infra/aws_templates.py``, the "devices" being files under its root folder.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from producer.settings import Settings
from tests.infra.aws_templates import PARAMS, load, option, run, user_data
from tests.infra.k8s_render import settings_of
from worker.lifecycle.poolwatch import WARM_START_S, start_timeout

SNAPSHOT = "snap-0123456789abcdef0"
WARM = "Wan2.2-TI2V-5B-Diffusers"
SHARDS = [f"transformer/diffusion_pytorch_model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
MODELS = dict(ModelSnapshotId=SNAPSHOT, ModelWarmupFolder=WARM, WarmupTiers="exact,fp8",
              WarmupGenerateSizes="704x1280x121")


def _docker_runs(calls: list[list[str]]) -> list[list[str]]:
    """docker's own options of each `docker run` (the worker's arguments left out)."""
    image = PARAMS["WorkerImage"]
    return [c[: c.index(image)] for c in calls if c[:2] == ["docker", "run"]]


def _model_folder(root: Path) -> list[Path]:
    """The warm-up model's files as the mounted volume would show them at /models."""
    files = [root / "models" / WARM / name for name in ["model_index.json", *SHARDS]]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"{}")
    return files


def _env(run_opts: list[str], env_file: Path) -> dict[str, str]:
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    for setting in option(run_opts, "--env"):
        name, _, value = setting.partition("=")
        env[name] = value
    return env


def _operand(call: list[str], name: str) -> str:
    """The value of dd's ``name=value`` operand in one recorded call."""
    (value,) = [a.split("=", 1)[1] for a in call if a.startswith(f"{name}=")]
    return value


@pytest.mark.parametrize(("found_by", "pre_read"), [("udev", "true"), ("nvme", "false")])
def test_a_snapshot_is_mounted_read_only_in_every_worker_with_the_warm_up(
    tmp_path: Path, found_by: str, pre_read: str
) -> None:
    # Given a two-GPU instance whose model volume is the NVMe device nvme1n1 (the root volume
    # is nvme0n1), named /dev/sdm by a udev link or only in its NVMe vendor data,
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    for dev in ("nvme0n1", "nvme1n1"):
        (root / "dev" / dev).touch()
    if found_by == "udev":
        (root / "dev/sdm").symlink_to("nvme1n1")
    files = _model_folder(root)
    # when the boot script runs with the snapshot and the warm-up parameters,
    script = user_data("WorkerLaunchTemplate", **MODELS, ModelPreRead=pre_read)
    done, calls = run(script, tmp_path, gpus=2, nvme_names="nvme0n1=xvda nvme1n1=sdm")
    assert done.returncode == 0, done.stderr
    # it mounts that device, and only that one, read-only at /models (XFS: a twin UUID is fine),
    device = str((root / "dev/nvme1n1").resolve())
    mounts = [c for c in calls if c[0] == "mount"]
    assert mounts == [["mount", "-o", "ro,noatime,nouuid", device, f"{root}/models"]]
    # again at a reboot, by the volume id, before docker restarts the workers,
    (fstab,) = (root / "etc/fstab").read_text().splitlines()
    source, target, _, opts, *_ = fstab.split()
    assert source == "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef1"
    assert target == "/models"
    assert {"ro", "nofail", "x-systemd.before=docker.service"} <= set(opts.split(","))
    # and gives every worker the volume read-only, as its file root, with the warm-up settings,
    runs = _docker_runs(calls)
    assert len(runs) == 2
    for opts in runs:
        assert f"{root}/models:/models:ro" in option(opts, "--volume")
        env = _env(opts, root / "etc/framefleet/worker.env")
        s = settings_of(env)
        assert s.file_root_list == ("/models",)
        assert s.warmup_model == f"/models/{WARM}"
        assert (s.warmup_tiers, s.warmup_generate_sizes) == ("exact,fp8", "704x1280x121")
        # whose start the worker bounds as a warm-up's: below the ready hook's timeout.
        assert start_timeout(s) == WARM_START_S
    # With ModelPreRead, every file of the warm-up model is read through once, before the
    # workers start (the volume's first read is the slow one); without it, none.
    reads = [i for i, c in enumerate(calls) if c[0] == "dd"]
    if pre_read == "true":
        assert sorted(_operand(calls[i], "if") for i in reads) == sorted(map(str, files))
        first_run = next(i for i, c in enumerate(calls) if c[:2] == ["docker", "run"])
        assert max(reads) < first_run
        assert "read the warm-up model through" in done.stdout
    else:
        assert reads == []


def test_without_a_snapshot_there_is_no_volume_no_mount_and_no_warm_up(tmp_path: Path) -> None:
    # Given the default parameters (no ModelSnapshotId), the launch template adds no volume,
    mappings = _worker_template()["BlockDeviceMappings"]
    (conditional,) = [m for m in mappings if "Fn::If" in m]
    condition, _, absent = conditional["Fn::If"]
    assert absent == {"Ref": "AWS::NoValue"}
    assert load("fleet.yaml")["Conditions"][condition] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "ModelSnapshotId"}, ""]}]
    }
    # and the boot script looks for no device, mounts nothing and sets no warm-up or root.
    done, calls = run(user_data("WorkerLaunchTemplate"), tmp_path, gpus=2)
    assert done.returncode == 0, done.stderr
    assert not [c for c in calls if c[0] in {"mount", "nvme", "lsblk", "dd"}]
    assert not (tmp_path / "root/etc/fstab").exists()
    for opts in _docker_runs(calls):
        # (the compile cache's volume only)
        assert option(opts, "--volume") == [
            f"{tmp_path}/root/var/cache/framefleet:/var/cache/framefleet"
        ]
        env = _env(opts, tmp_path / "root/etc/framefleet/worker.env")
        assert not [k for k in env if k.startswith("FRAMEFLEET_WARMUP_")]
        assert "FRAMEFLEET_FILE_ROOTS" not in env


def test_a_model_volume_that_never_appears_gives_the_instance_up(tmp_path: Path) -> None:
    # Given a snapshot parameter but no device named sdm (only the root volume),
    (tmp_path / "root/dev").mkdir(parents=True)
    (tmp_path / "root/dev/nvme0n1").touch()
    started = time.monotonic()
    done, calls = run(user_data("WorkerLaunchTemplate", **MODELS), tmp_path, gpus=1,
                      nvme_names="nvme0n1=xvda")
    # the boot script stops after its bounded wait (2 s x 60, sleep stood in), saying why,
    assert time.monotonic() - started < 60
    assert done.returncode != 0
    assert "model volume" in done.stderr and SNAPSHOT in done.stderr
    assert sum(c[0] == "nvme" for c in calls) == 60
    # starts no worker, and gives the instance up at once.
    assert not _docker_runs(calls)
    assert _ready_results(calls) == ["ABANDON"]


def test_a_warm_up_folder_missing_from_the_volume_gives_the_instance_up(tmp_path: Path) -> None:
    (tmp_path / "root/dev").mkdir(parents=True)
    (tmp_path / "root/dev/nvme1n1").touch()
    (tmp_path / "root/dev/sdm").symlink_to("nvme1n1")
    done, calls = run(user_data("WorkerLaunchTemplate", **MODELS), tmp_path, gpus=1)
    assert done.returncode != 0
    assert f"/models/{WARM} is not on the model volume" in done.stderr
    assert not _docker_runs(calls)
    assert _ready_results(calls) == ["ABANDON"]


def test_the_model_volume_is_provisioned_for_its_first_read() -> None:
    fleet = load("fleet.yaml")
    params = fleet["Parameters"]
    (conditional,) = [m for m in _worker_template()["BlockDeviceMappings"] if "Fn::If" in m]
    mapping = conditional["Fn::If"][1]
    ebs = mapping["Ebs"]
    assert ebs["SnapshotId"] == {"Ref": "ModelSnapshotId"}
    assert ebs["DeleteOnTermination"] is True  # one volume per instance, gone with it
    # The boot script looks for the name the launch template gives it.
    name = mapping["DeviceName"].removeprefix("/dev/")
    assert f"dev=$(find_volume {name})" in user_data("WorkerLaunchTemplate", **MODELS)
    # gp3 by default at 1000 MiB/s, which gp3 allows only with 4 IOPS per MiB/s.
    assert params["ModelVolumeType"]["Default"] == "gp3"
    assert params["ModelVolumeThroughput"]["Default"] >= 1000
    assert params["ModelVolumeIops"]["Default"] * 0.25 >= params["ModelVolumeThroughput"]["Default"]
    # The warm-up parameters admit exactly what the worker's settings admit.
    schema = Settings.model_json_schema()["properties"]
    for param, field in [("WarmupTiers", "warmup_tiers"),
                         ("WarmupGenerateSizes", "warmup_generate_sizes")]:
        assert params[param]["AllowedPattern"] == schema[field]["pattern"], param
        assert params[param]["Default"] == schema[field]["default"], param


def _worker_template() -> dict[str, Any]:
    data: dict[str, Any] = load("fleet.yaml")["Resources"]["WorkerLaunchTemplate"]["Properties"][
        "LaunchTemplateData"
    ]
    return data


def _ready_results(calls: list[list[str]]) -> list[str]:
    return [
        option(c, "--lifecycle-action-result")[0]
        for c in calls
        if c[:3] == ["aws", "autoscaling", "complete-lifecycle-action"]
    ]
