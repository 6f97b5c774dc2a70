"""The README's first-deploy sequence is what a new user can run, and the docs cannot drift.

* every command of the README's "A first deploy, in short" exists (a Makefile target that
  `make -n` accepts with those arguments) and has its own tests; `make bootstrap` runs the pinned
  CDK CLI's bootstrap on the environment's account and region;
* the key table of docs/operate.md's "A first deploy into an empty account" is the output of the
  key function (`--show-layout`), and docs/intent.md uploads with `make publish` to that key, not
  by hand;
* every example message in that section, and the deployment refusals of docs/operate.md, is what
  the code prints, byte for byte.
"""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.artifact_layout import artifact_layout
from stacks.settings import REPO_ROOT, SettingsError, load_settings, parse_settings
from tests.support.artifacts import (
    write_adapters,
    write_intent_archive,
    write_model_dir,
)
from tools.preflight.checks import (
    BootstrapRequirement,
    bootstrap_problem,
    quota_needs,
    quota_problems,
)
from tools.publish.__main__ import main as publish

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
OPERATE = (REPO_ROOT / "docs" / "operate.md").read_text(encoding="utf-8")
SEQUENCE_START = "## A first deploy, in short"
SECTION_START = "## A first deploy into an empty account"

TESTED_BY = {
    "setup": "tests/stacks/test_checks.py",  # every synth and test runs in what setup installs
    "bootstrap": "tests/test_readme_deploy.py",  # test_bootstrap_runs_the_pinned_cli_on_the_env
    "deploy": "tests/tools/test_deploy_sequence.py",
    "publish": "tests/tools/test_publish.py",
    "preflight": "tests/tools/test_preflight.py",
}


def between(text: str, heading: str) -> str:
    """The section of ``text`` under the level-2 ``heading``, up to the next level-2 heading."""
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end == -1 else text[start:end]


def section() -> str:
    return between(OPERATE, SECTION_START)


def commands() -> list[list[str]]:
    """The README sequence's bash block's commands, continuations joined, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", between(README, SEQUENCE_START), re.S)
    assert block is not None
    text = block.group(1).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.strip()]


def test_the_sequence_is_bootstrap_deploy_publish_preflight_deploy() -> None:
    steps = [" ".join(words[:2]) for words in commands()]
    assert steps == ["make setup", "make bootstrap", "make deploy", "make publish",
                     "make preflight", "make deploy"]


@pytest.mark.parametrize("words", [c for c in commands() if c[0] == "make"],
                         ids=lambda words: " ".join(words))
def test_every_make_command_exists_and_is_tested(words: list[str]) -> None:
    target = words[1]
    result = subprocess.run(["make", "-n", "--no-print-directory", *words[1:]], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "No rule to make target" not in result.stderr
    assert (REPO_ROOT / TESTED_BY[target]).is_file()


def test_bootstrap_runs_the_pinned_cli_on_the_env() -> None:
    """`make bootstrap ENV=prod` is `cdk bootstrap aws://<prod's account>/<prod's region>` with
    the pinned CLI: its recipe, as `make -n` prints it, run with `echo` for the CLI."""
    (bootstrap,) = [c for c in commands() if c[:2] == ["make", "bootstrap"]]
    assert bootstrap[2:] == ["ENV=prod"]
    dry = subprocess.run(["make", "-n", "--no-print-directory", *bootstrap[1:]], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    (line,) = [line for line in dry.splitlines() if " bootstrap " in line]
    cli = "node_modules/.bin/cdk"
    assert line.startswith(f"{cli} bootstrap aws://$(")
    shown = subprocess.run(["bash", "-c", "echo " + line.removeprefix(cli)], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=60, check=True).stdout
    settings = load_settings("prod")
    assert shown.split() == ["bootstrap", f"aws://{settings.account}/{settings.region}"]
    result = subprocess.run([str(REPO_ROOT / cli), "bootstrap", "--help"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("cdk bootstrap [ENVIRONMENTS..]")


def test_the_key_table_is_the_key_functions_output() -> None:
    table = re.search(r"```text\n(LLM model data.*?)```", section(), re.S)
    assert table is not None
    result = subprocess.run([sys.executable, "-m", "tools.publish", "--env", "prod",
                             "--show-layout"], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True, timeout=60)
    assert table.group(1).strip() == result.stdout.strip()


def test_nothing_is_uploaded_by_hand() -> None:
    for path in [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"aws s3 (cp|sync) \S+ s3://", text), path


def test_the_intent_guide_publishes_to_the_configured_key() -> None:
    guide = (REPO_ROOT / "docs" / "intent.md").read_text(encoding="utf-8")
    assert "make publish ENV=prod INTENT=build/intent-inf1/model.tar.gz" in guide
    key = artifact_layout(load_settings("prod")).intent.model_data_key
    assert f"`{key}`" in guide
    assert "intent/inf1/model.tar.gz" not in guide


def test_the_refusals_shown_are_the_ones_printed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_model_dir(Path("model"))
    write_adapters(Path("lora"), {"manga_domain": 64, "general_support": 128,
                                  "jp_translation": 32})
    write_intent_archive(Path("build/intent-inf2"), target="inf2")
    out = io.StringIO()
    code = publish(["--env", "prod", "--model", "model", "--adapters", "lora",
                    "--intent", "build/intent-inf2/model.tar.gz"], out=out)
    assert code == 2
    printed = out.getvalue().splitlines()
    shown = [line for line in section().splitlines() if line.startswith("publish: refused:")]
    assert len(shown) == 2
    assert shown == printed


def test_the_preflight_lines_shown_are_the_ones_printed() -> None:
    shown = [line.removeprefix("preflight: ") for line in section().splitlines()
             if line.startswith("preflight: ")]
    settings = load_settings("prod")
    requirement = BootstrapRequirement(6, "/cdk-bootstrap/hnb659fds/version")
    assert shown[0] == bootstrap_problem(requirement, deployed_version=None, toolkit_status=None,
                                         account=settings.account, region=settings.region)
    needs = quota_needs(settings, [load_settings("dev")])
    quotas = {need.quota_name: (2.0, "L-...") for need in needs}
    endpoint = [n for n in needs if n.usage == "endpoint"]
    assert shown[1] == quota_problems(endpoint, quotas, region=settings.region)[0]


def test_the_deployment_refusals_shown_are_the_ones_printed() -> None:
    import yaml

    lines = [line.removeprefix("error: ") for line in OPERATE.splitlines()
             if line.startswith(("error: config/dev.yaml: llm: deployment",
                                 "error: config/dev.yaml: intent: deployment"))]
    assert len(lines) == 2
    for line, (endpoint, deployment) in zip(lines, [
            ("llm", {"traffic_shift": "canary", "canary_percent": 50}),
            ("intent", {"traffic_shift": "canary", "canary_percent": 10})], strict=True):
        data = yaml.safe_load((REPO_ROOT / "config" / "dev.yaml").read_text())
        data[endpoint]["deployment"] = deployment
        with pytest.raises(SettingsError) as info:
            parse_settings(data, source="config/dev.yaml")
        assert str(info.value) == line
