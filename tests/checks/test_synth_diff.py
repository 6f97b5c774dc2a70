"""The synth-diff review command on two commits of a throwaway copy of this repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(
    ".git", ".venv*", "node_modules", "cdk.out*", "__pycache__", ".*_cache", ".hypothesis",
    ".cache", "tests",
)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"})


@pytest.fixture(scope="module")
def two_commit_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(REPO_ROOT, repo, ignore=SKIP, dirs_exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    dev = repo / "config" / "dev.yaml"
    text = dev.read_text()
    assert "noncurrent_version_expiration_days: 14" in text
    dev.write_text(text.replace("noncurrent_version_expiration_days: 14",
                                "noncurrent_version_expiration_days: 30"))
    git(repo, "commit", "-q", "-am", "keep replaced artifact versions longer")
    return repo


def run_diff(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cli = REPO_ROOT / "node_modules" / ".bin" / "cdk"
    assert cli.exists(), "the pinned CDK CLI is missing: run `make setup`"
    return subprocess.run(
        [sys.executable, "-m", "checks.synth_diff", "--env", "dev", *args],
        cwd=repo, capture_output=True, text=True, check=False,
        env={**os.environ, "CDK_CLI": str(cli)},
    )


@pytest.mark.slow
def test_diff_shows_the_changed_property_and_fails_when_asked(two_commit_repo: Path) -> None:
    result = run_diff(two_commit_repo, "--base", "HEAD~1", "--fail")
    assert result.returncode == 1, result.stderr
    assert "=== Dev/Foundation: changed" in result.stdout
    assert "[~] AWS::S3::Bucket Foundation/ModelArtifacts/Bucket" in result.stdout
    assert '[-]     "NoncurrentDays": 14' in result.stdout
    assert '[+]     "NoncurrentDays": 30' in result.stdout
    assert "1 stack(s) differ from HEAD~1: Dev/Foundation" in result.stdout
    assert "ASSET-HASH" not in result.stdout
    listed = subprocess.run(["git", "worktree", "list"], cwd=two_commit_repo,
                            capture_output=True, text=True, check=True).stdout
    assert len(listed.strip().splitlines()) == 1  # the base's temporary worktree is gone


def test_no_changes_exits_zero_even_with_fail_without_synthesizing(two_commit_repo: Path
                                                                   ) -> None:
    result = run_diff(two_commit_repo, "--base", "HEAD", "--fail")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no infrastructure changes against HEAD: the working tree is its tree" in result.stdout
    assert "synthesizing" not in result.stderr


@pytest.mark.parametrize("change", ["modified", "untracked"])
def test_a_working_tree_change_is_synthesized_even_against_head(two_commit_repo: Path,
                                                                 change: str) -> None:
    """What git sees as changed or untracked keeps the working tree from counting as the base's
    tree (the synthesis would read it); the fixture's repository is left as it was."""
    dev = two_commit_repo / "config" / "dev.yaml"
    original = dev.read_text()
    extra = two_commit_repo / "stacks" / "new_construct.py"
    probe = [sys.executable, "-c",
             "from checks.synth_diff import unchanged_tree; print(unchanged_tree('HEAD'))"]
    try:
        if change == "modified":
            dev.write_text(original + "\n")
        else:
            extra.write_text("")
        answer = subprocess.run(probe, cwd=two_commit_repo, capture_output=True, text=True,
                                check=True).stdout.strip()
    finally:
        dev.write_text(original)
        extra.unlink(missing_ok=True)
    assert answer == "False"
    assert subprocess.run(probe, cwd=two_commit_repo, capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


def test_unknown_base_ref_is_a_clear_error(two_commit_repo: Path) -> None:
    result = run_diff(two_commit_repo, "--base", "no-such-ref")
    assert result.returncode == 2
    assert "cannot check out base ref 'no-such-ref'" in result.stderr


def test_scrub_replaces_only_asset_hashes() -> None:
    from checks import synth_diff
    digest = "a" * 64
    text, found = synth_diff.scrub(f'{{"S3Key": "{digest}.zip", "Id": "{"b" * 63}"}}')
    assert found == {digest}
    assert text == f'{{"S3Key": "ASSET-HASH.zip", "Id": "{"b" * 63}"}}'
