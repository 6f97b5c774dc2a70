"""The AWS side both deployment tools share: whose credentials, which key, which stack.

`make publish` and `make preflight` talk to the environment's account and region with boto3's
default credential chain (AWS_PROFILE, SSO, instance roles) and never with anything else.
"""

from __future__ import annotations

import argparse
from typing import Any

from stacks.settings import EnvironmentSettings

EXIT_OK, EXIT_AWS, EXIT_REFUSED = 0, 1, 2
"""``make publish`` and ``make promote``'s exit statuses: done (or nothing to do), AWS refused or
failed (re-run: what is there already is skipped), refused by a check or a bad argument."""

PROJECT_KEY_OUTPUT = "ProjectKeyArn"
"""The Foundation stack's output holding the project KMS key (stacks/foundation_stack.py)."""


def environment_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The opening every deployment command shares: its module docstring as its help, as
    written, and ``--env`` (required)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", required=True, help="environment: config/<env>.yaml")
    return parser


class DeployToolError(RuntimeError):
    """Something stops the tool; the message is one line naming the fix."""


def aws_session(settings: EnvironmentSettings) -> Any:
    """A boto3 session in the environment's region."""
    import boto3

    return boto3.Session(region_name=settings.region)


def caller_account(session: Any) -> str:
    """The account the credentials belong to (sts get-caller-identity)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return str(session.client("sts").get_caller_identity()["Account"])
    except (BotoCoreError, ClientError) as error:
        raise DeployToolError(
            f"no usable AWS credentials ({error}): log in (aws sso login, or set AWS_PROFILE)"
        ) from None


def account_problem(settings: EnvironmentSettings, account: str) -> str | None:
    """One line when the credentials are for another account than the settings name."""
    if account == settings.account:
        return None
    return (f"the credentials are for account {account}, but config/{settings.name}.yaml deploys "
            f"to {settings.account}: switch credentials (AWS_PROFILE) or fix `account`")


def stack_outputs(session: Any, stack_name: str) -> dict[str, str] | None:
    """The outputs of a deployed stack, or None when it does not exist."""
    from botocore.exceptions import ClientError

    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        if "does not exist" in str(error):
            return None
        raise
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def project_key_arn(session: Any, settings: EnvironmentSettings) -> str:
    """The project key's ARN from the Foundation stack's outputs (describe-stacks)."""
    outputs = stack_outputs(session, settings.foundation_stack_name)
    if outputs is None:
        raise DeployToolError(
            f"stack {settings.foundation_stack_name} does not exist in {settings.region}: deploy "
            f"the Foundation stack first (make deploy ENV={settings.name} does, then stops at "
            "the preflight until the artifacts are published)")
    if PROJECT_KEY_OUTPUT not in outputs:
        raise DeployToolError(f"stack {settings.foundation_stack_name} has no output "
                              f"{PROJECT_KEY_OUTPUT}: redeploy it from this repository")
    return outputs[PROJECT_KEY_OUTPUT]
