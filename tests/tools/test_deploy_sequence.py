"""`make deploy ENV=<env>` deploys an empty account in order: Foundation, preflight, Serving.

The Makefile runs with a stand-in CDK CLI that records its arguments (nothing here can deploy)
and ``-o synth`` (the synth step is tested elsewhere); the preflight is the real command unless a
test replaces it with a stand-in that passes or fails.
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
    cdk.write_text(f'#!/bin/sh\necho "cdk $*" >> {log}\n')
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


def test_foundation_then_preflight_then_serving(fake_cdk: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    cdk, log = fake_cdk
    preflight = tmp_path / "preflight"
    preflight.write_text(f'#!/bin/sh\necho "preflight $*" >> {log}\n')
    preflight.chmod(0o755)
    result = make_deploy(cdk, log, f"PREFLIGHT={preflight}")
    assert result.returncode == 0, result.stderr
    assert calls(log) == [
        "cdk deploy --app cdk.out Prod/Foundation",
        "preflight --env prod --assembly cdk.out",
        "cdk deploy --app cdk.out --exclusively Prod/Serving",
    ]


def test_a_failed_preflight_stops_before_the_serving_stack(fake_cdk: tuple[Path, Path]) -> None:
    """The real preflight, without credentials: it cannot check, so Serving is not deployed."""
    cdk, log = fake_cdk
    result = make_deploy(cdk, log)
    assert result.returncode != 0
    assert calls(log) == ["cdk deploy --app cdk.out Prod/Foundation"]
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
