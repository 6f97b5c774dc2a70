"""Print what the delivery pipeline needs to reach one environment, from config/<env>.yaml.

The workflows in ``.github/workflows/`` hold no account id and no role ARN: a deploy job runs

    python -m tools.pipeline_settings --env prod --github-output

and passes ``steps.<id>.outputs.role_arn`` / ``region`` to aws-actions/configure-aws-credentials.
Changing an account or a role is therefore a reviewed change of the validated settings, and a
missing ``delivery`` section fails the job with the settings' own message.

    python -m tools.pipeline_settings --env dev            # key=value lines on stdout
    python -m tools.pipeline_settings --env dev --github-output   # appended to $GITHUB_OUTPUT
    python -m tools.pipeline_settings --env dev --deploy-role-policy   # the role's permissions

The deploy role's permissions policy is what tools/deploy_role.py builds for the environment
(docs/delivery.md: how to attach it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stacks.settings import CONFIG_DIR, EnvironmentSettings, SettingsError, load_settings
from tools.deploy_role import DeployRoleError, deploy_role_policy


class PipelineSettingsError(ValueError):
    """The environment cannot be deployed by the pipeline; the message says why."""


def pipeline_values(settings: EnvironmentSettings) -> dict[str, str]:
    """The values a deploy job needs, in the order they are printed."""
    delivery = settings.delivery
    if delivery is None:
        raise PipelineSettingsError(
            f"config/{settings.name}.yaml: delivery: section is missing; the pipeline needs "
            "delivery.github_repository, delivery.github_environment and delivery.deploy_role_arn"
        )
    return {
        "environment": settings.name,
        "stage": settings.stage_name,
        "account": settings.account,
        "region": settings.region,
        "role_arn": delivery.deploy_role_arn,
        "github_environment": delivery.github_environment,
        "github_repository": delivery.github_repository,
    }


def render(values: dict[str, str]) -> str:
    """``key=value`` lines (the $GITHUB_OUTPUT format for single-line values)."""
    for key, value in values.items():
        if "\n" in value or "\r" in value:
            raise PipelineSettingsError(f"{key}: value contains a line break: {value!r}")
    return "".join(f"{key}={value}\n" for key, value in values.items())


def print_policy(env: str, config_dir: Path) -> int:
    """Print the deploy role's permissions policy of ``env``; the exit status."""
    try:
        policy = deploy_role_policy(load_settings(env, config_dir=config_dir))
    except (SettingsError, DeployRoleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(policy, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.pipeline_settings", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--env", required=True, help="environment: config/<env>.yaml")
    parser.add_argument("--github-output", action="store_true",
                        help="append to the file named by $GITHUB_OUTPUT instead of stdout")
    parser.add_argument("--deploy-role-policy", action="store_true",
                        help="print the deploy role's permissions policy (JSON) and exit")
    parser.add_argument("--expect-github-environment", metavar="NAME",
                        help="fail unless delivery.github_environment is NAME (the job's "
                             "`environment:`), so a workflow cannot deploy prod from dev's job")
    args = parser.parse_args(argv)
    config_dir = Path(os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR))
    if args.deploy_role_policy:
        return print_policy(args.env, config_dir)
    try:
        values = pipeline_values(load_settings(args.env, config_dir=config_dir))
        if (args.expect_github_environment is not None
                and values["github_environment"] != args.expect_github_environment):
            raise PipelineSettingsError(
                f"config/{args.env}.yaml: delivery.github_environment: "
                f"{values['github_environment']!r} is not accepted: this job runs in the GitHub "
                f"environment {args.expect_github_environment!r}"
            )
        text = render(values)
    except (SettingsError, PipelineSettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.github_output:
        target = os.environ.get("GITHUB_OUTPUT")
        if not target:
            print("error: --github-output: $GITHUB_OUTPUT is not set (not in GitHub Actions?)",
                  file=sys.stderr)
            return 1
        with open(target, "a", encoding="utf-8") as output:
            output.write(text)
        print(f"{args.env}: stage {values['stage']}, account {values['account']}, region "
              f"{values['region']}, role {values['role_arn']}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
