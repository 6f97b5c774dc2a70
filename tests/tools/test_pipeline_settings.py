"""tools.pipeline_settings: what a deploy job reads from config/<env>.yaml, and its refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tools.pipeline_settings import main

CONFIG = Path(__file__).resolve().parents[2] / "config"


def test_prints_the_role_account_and_region_of_the_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--env", "prod"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "environment=prod", "stage=Prod", "account=123456789012", "region=ap-northeast-1",
        "role_arn=arn:aws:iam::123456789012:role/manga-assist-prod-github-deploy",
        "github_environment=prod", "github_repository=example-org/mangaassist-gpu-platform"]


def test_appends_to_github_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = tmp_path / "github_output"
    output.write_text("earlier=1\n")
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    assert main(["--env", "dev", "--github-output", "--expect-github-environment", "dev"]) == 0
    lines = output.read_text().splitlines()
    assert lines[0] == "earlier=1"
    assert "role_arn=arn:aws:iam::123456789012:role/manga-assist-dev-github-deploy" in lines


def test_refuses_a_job_running_in_another_github_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--env", "prod", "--expect-github-environment", "dev"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: config/prod.yaml: delivery.github_environment: 'prod' is not accepted: this job "
        "runs in the GitHub environment 'dev'")


def test_a_missing_delivery_section_or_a_foreign_role_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(CONFIG, tmp_path / "config")
    monkeypatch.setenv("MANGAASSIST_CONFIG_DIR", str(tmp_path / "config"))
    path = tmp_path / "config" / "dev.yaml"
    data = yaml.safe_load(path.read_text())
    data["delivery"]["deploy_role_arn"] = "arn:aws:iam::999999999999:role/deploy"
    path.write_text(yaml.safe_dump(data))
    assert main(["--env", "dev"]) == 1
    assert ("delivery.deploy_role_arn: 'arn:aws:iam::999999999999:role/deploy' is in account "
            "999999999999; accepted: a role in this environment's account 123456789012"
            ) in capsys.readouterr().err
    del data["delivery"]
    path.write_text(yaml.safe_dump(data))
    assert main(["--env", "dev"]) == 1
    assert capsys.readouterr().err.startswith(
        "error: config/dev.yaml: delivery: section is missing; the pipeline needs")
