#!/usr/bin/env python3
"""Show what a change does to the infrastructure: synth a base git ref and the working tree, diff.

    python -m checks.synth_diff --base origin/main [--env dev] [--fail]

The base ref is checked out into a temporary git worktree and synthesized offline with this
checkout's virtual environment; the working tree is synthesized as it is, uncommitted changes
included. Each stack is then compared with the CDK CLI's CloudFormation-aware diff
(``cdk diff --app <new assembly> --template <base template> <stack>``, which needs no
credentials). Asset hashes (Lambda code, container images) change whenever any byte of an asset
does, so they are scrubbed before diffing and reported on one line per stack instead; only real
changes to resources and properties show.

A working tree that is exactly the base ref's tree (nothing modified, staged or untracked) is
reported unchanged without synthesizing either side.

Exit status: 0 when done (or no changes), 1 with ``--fail`` when any stack changed, 2 on error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSET_HASH = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
SCRUBBED = "ASSET-HASH"


class DiffError(RuntimeError):
    """Something the reviewer must fix before a diff can be shown (bad ref, broken synth)."""


@dataclass(frozen=True)
class StackTemplate:
    """One synthesized stack: its display name (``Dev/Foundation``) and template file."""

    display_name: str
    template_path: Path


def iter_stacks(assembly_dir: Path) -> Iterator[StackTemplate]:
    """Every CloudFormation stack in a cloud assembly, nested stage assemblies included."""
    manifest_path = assembly_dir / "manifest.json"
    if not manifest_path.is_file():
        return
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        properties = artifact.get("properties", {})
        if artifact.get("type") == "aws:cloudformation:stack":
            yield StackTemplate(
                display_name=artifact.get("displayName", artifact_id),
                template_path=assembly_dir / properties["templateFile"],
            )
        elif artifact.get("type") == "cdk:cloud-assembly":
            yield from iter_stacks(assembly_dir / properties["directoryName"])


def scrub(template_text: str) -> tuple[str, frozenset[str]]:
    """Replace asset hashes with a constant; return the text and the hashes found."""
    hashes = frozenset(ASSET_HASH.findall(template_text))
    return ASSET_HASH.sub(SCRUBBED, template_text), hashes


def synthesize(source_dir: Path, outdir: Path, environments: Sequence[str], python: str) -> None:
    """Run ``app.py`` of ``source_dir`` offline, writing the cloud assembly to ``outdir``."""
    env = {
        **os.environ,
        "CDK_OUTDIR": str(outdir),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if environments:
        env["CDK_CONTEXT_JSON"] = json.dumps({"environments": ",".join(environments)})
    result = subprocess.run(
        [python, "app.py"], cwd=source_dir, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-20:]
        raise DiffError(f"synth failed in {source_dir}:\n" + "\n".join(detail))


def scrubbed_copy(assembly_dir: Path, target: Path) -> dict[str, frozenset[str]]:
    """Copy an assembly without its staged assets, scrubbing templates; return hashes per stack."""
    shutil.copytree(assembly_dir, target, ignore=shutil.ignore_patterns("asset.*"))
    hashes: dict[str, frozenset[str]] = {}
    for stack in iter_stacks(target):
        text, found = scrub(stack.template_path.read_text(encoding="utf-8"))
        stack.template_path.write_text(text, encoding="utf-8")
        hashes[stack.display_name] = found
    return hashes


def cdk_cli() -> list[str]:
    """The pinned CDK CLI: $CDK_CLI if set, else this checkout's node_modules/.bin/cdk."""
    configured = os.environ.get("CDK_CLI")
    if configured:
        return [configured]
    local = REPO_ROOT / "node_modules" / ".bin" / "cdk"
    if not local.exists():
        raise DiffError(f"the pinned CDK CLI is not installed at {local}: run `make setup`")
    return [str(local)]


def cdk_diff(new_assembly: Path, base_template: Path, stack: str) -> tuple[bool, str]:
    """Run the CDK CLI's offline template diff; return (changed, output)."""
    result = subprocess.run(
        [
            *cdk_cli(), "diff", "--fail", "--exclusively", "--no-notices",
            "--no-version-reporting",
            "--app", str(new_assembly), "--template", str(base_template), stack,
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "CDK_DISABLE_CLI_TELEMETRY": "1", "FORCE_COLOR": "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    output = (result.stdout + result.stderr).strip()
    summary = re.search(r"Number of stacks with differences: (\d+)", output)
    if result.returncode not in (0, 1) or summary is None:
        raise DiffError(f"cdk diff failed for {stack} (exit {result.returncode}):\n{output}")
    return int(summary.group(1)) > 0, output


def diff_assemblies(base_dir: Path | None, new_dir: Path, work: Path) -> tuple[list[str], str]:
    """Diff every stack of two assemblies; return (changed stack names, report text)."""
    base_templates: dict[str, tuple[str, frozenset[str]]] = {}
    if base_dir is not None:
        for stack in iter_stacks(base_dir):
            base_templates[stack.display_name] = scrub(
                stack.template_path.read_text(encoding="utf-8")
            )
    new_copy = work / "new"
    new_hashes = scrubbed_copy(new_dir, new_copy)

    changed: list[str] = []
    report: list[str] = []
    for name in sorted(set(base_templates) | set(new_hashes)):
        if name not in new_hashes:
            changed.append(name)
            report.append(f"=== {name}: stack removed")
            continue
        base_text, base_hashes = base_templates.get(name, ("{}", frozenset()))
        base_file = work / f"base-{re.sub(r'[^A-Za-z0-9]+', '-', name)}.json"
        base_file.write_text(base_text, encoding="utf-8")
        differs, output = cdk_diff(new_copy, base_file, name)
        if name not in base_templates:
            title = "new stack"
        else:
            title = "changed" if differs else "no changes"
        lines = [f"=== {name}: {title}"]
        asset_changes = len(new_hashes[name] - base_hashes)
        if asset_changes and name in base_templates:
            lines.append(f"    {asset_changes} asset(s) changed content (Lambda code or image)")
            differs = True
        if differs or name not in base_templates:
            changed.append(name)
            lines.append(_strip_cli_noise(output))
        report.append("\n".join(lines))
    return changed, "\n\n".join(report)


def _strip_cli_noise(output: str) -> str:
    keep = [
        line for line in output.splitlines()
        if not line.startswith(("Stack ", "✨", "Number of stacks with differences"))
    ]
    return "\n".join(keep).strip()


def worktree(ref: str, into: Path) -> None:
    """Check ``ref`` out into ``into`` as a detached git worktree."""
    result = subprocess.run(
        ["git", "worktree", "add", "--detach", "--force", str(into), ref],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise DiffError(f"cannot check out base ref {ref!r}: {result.stderr.strip()}")


def remove_worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT,
                   capture_output=True, check=False)


def unchanged_tree(ref: str) -> bool:
    """Whether the working tree is exactly ``ref``'s tree: ``ref`` names the tree HEAD names and
    git sees nothing modified, staged or untracked (ignored files aside: a change does not carry
    them). Then two syntheses would compare a tree with itself."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=False)

    base = git("rev-parse", "--verify", "--quiet", f"{ref}^{{tree}}")
    head = git("rev-parse", "--verify", "--quiet", "HEAD^{tree}")
    if base.returncode or head.returncode or base.stdout.strip() != head.stdout.strip():
        return False
    status = git("status", "--porcelain", "--untracked-files=all")
    return status.returncode == 0 and not status.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks.synth_diff",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="git ref to compare against (default HEAD)")
    parser.add_argument("--env", action="append", default=[], dest="environments",
                        help="environment to synthesize (repeatable; default: all)")
    parser.add_argument("--fail", action="store_true", help="exit 1 when any stack changed")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs app.py")
    args = parser.parse_args(argv)

    if unchanged_tree(args.base):
        print(f"no infrastructure changes against {args.base}: the working tree is its tree, "
              "nothing synthesized")
        return 0
    with tempfile.TemporaryDirectory(prefix="synth-diff-") as tmp:
        work = Path(tmp)
        base_src = work / "base-src"
        try:
            worktree(args.base, base_src)
            try:
                base_out: Path | None = None
                if (base_src / "app.py").is_file():
                    base_out = work / "base-out"
                    print(f"synthesizing base {args.base} ...", file=sys.stderr, flush=True)
                    synthesize(base_src, base_out, args.environments, args.python)
                else:
                    print(f"base {args.base} has no app.py: every stack is new", file=sys.stderr)
                print("synthesizing working tree ...", file=sys.stderr, flush=True)
                new_out = work / "new-out"
                synthesize(REPO_ROOT, new_out, args.environments, args.python)
                changed, report = diff_assemblies(base_out, new_out, work)
            finally:
                remove_worktree(base_src)
        except DiffError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(report)
    print()
    if changed:
        print(f"{len(changed)} stack(s) differ from {args.base}: {', '.join(changed)}")
    else:
        print(f"no infrastructure changes against {args.base}")
    return 1 if (changed and args.fail) else 0


if __name__ == "__main__":
    sys.exit(main())
