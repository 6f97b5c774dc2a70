"""`make deploy ENV=<env>` deploys an empty account in order: Foundation, preflight, the Serving
stack's images and their check, Serving.

The Makefile runs with a stand-in CDK CLI that records its arguments and the build environment
it gets (nothing here can deploy or build) and ``-o synth`` (the synth step is tested
elsewhere); the preflight and the image check are the real commands unless a test replaces them
with stand-ins that pass or fail.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from stacks.settings import REPO_ROOT


@pytest.fixture
def fake_cdk(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "calls.log"
    cdk = tmp_path / "cdk"
    cdk.write_text(f'#!/bin/sh\necho "cdk $* [attestations off: $BUILDX_NO_DEFAULT_ATTESTATIONS]"'
                   f' >> {log}\n')
    cdk.chmod(0o755)
    return cdk, log


def make_deploy(cdk: Path, log: Path, *extra: str, env: str = "prod"
                ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environ.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent",
                   AWS_EC2_METADATA_DISABLED="true")
    return subprocess.run(["make", "--no-print-directory", "-o", "synth", "deploy", f"ENV={env}",
                           f"CDK={cdk}", *extra], cwd=REPO_ROOT, env=environ,
                          capture_output=True, text=True, timeout=120, check=False)


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def stand_in(tmp_path: Path, name: str, log: Path, *, exit_code: int = 0) -> Path:
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit {exit_code}\n')
    script.chmod(0o755)
    return script


def test_foundation_preflight_images_their_check_an_instance_switch_then_serving(
        fake_cdk: tuple[Path, Path], tmp_path: Path) -> None:
    """The images are published before the Serving stack (``cdk publish-assets``, one build at a
    time, without Docker's default provenance attestations) and checked: CloudFormation would
    only learn at CreateModel that SageMaker refuses their manifest."""
    cdk, log = fake_cdk
    result = make_deploy(cdk, log, f"PREFLIGHT={stand_in(tmp_path, 'preflight', log)}",
                         f"IMAGE_CHECK={stand_in(tmp_path, 'image-check', log)}",
                         f"INSTANCE_SWITCH={stand_in(tmp_path, 'instance-switch', log)}")
    assert result.returncode == 0, result.stderr
    assert calls(log) == [
        "cdk deploy --app cdk.out Prod/Foundation [attestations off: 1]",
        "preflight --env prod --assembly cdk.out",
        "cdk publish-assets --unstable=publish-assets --app cdk.out --exclusively --concurrency 1 "
        "Prod/Serving "
        "[attestations off: 1]",
        "image-check --env prod --assembly cdk.out",
        "instance-switch --env prod",
        "cdk deploy --app cdk.out --exclusively Prod/Serving [attestations off: 1]",
    ]


def test_an_image_sagemaker_would_refuse_stops_before_the_serving_stack(
        fake_cdk: tuple[Path, Path], tmp_path: Path) -> None:
    cdk, log = fake_cdk
    result = make_deploy(cdk, log, f"PREFLIGHT={stand_in(tmp_path, 'preflight', log)}",
                         f"IMAGE_CHECK={stand_in(tmp_path, 'image-check', log, exit_code=1)}")
    assert result.returncode != 0
    assert calls(log)[-1] == "image-check --env prod --assembly cdk.out"
    assert not any("deploy --app cdk.out --exclusively Prod/Serving" in c for c in calls(log))


def test_a_failed_preflight_stops_before_the_serving_stack(fake_cdk: tuple[Path, Path]) -> None:
    """The real preflight, without credentials: it cannot check, so Serving is not deployed."""
    cdk, log = fake_cdk
    result = make_deploy(cdk, log)
    assert result.returncode != 0
    assert calls(log) == ["cdk deploy --app cdk.out Prod/Foundation [attestations off: 1]"]
    assert "preflight: " in result.stderr


def test_an_unknown_environment_deploys_nothing(fake_cdk: tuple[Path, Path]) -> None:
    cdk, log = fake_cdk
    result = make_deploy(cdk, log, env="staging")
    assert result.returncode != 0
    assert calls(log) == []
    assert "config/staging.yaml: no such environment file" in result.stderr


def test_publish_passes_its_arguments_through() -> None:
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", "publish", "ENV=prod", "MODEL=/m", "ADAPTERS=/a",
         "INTENT=/i/model.tar.gz"], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        timeout=60)
    assert ('-m tools.publish --env prod --model "/m" --adapters "/a" --intent '
            '"/i/model.tar.gz"') in result.stdout
