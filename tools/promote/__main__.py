"""`python -m tools.promote`: make a quantization run's candidate the LLM's model data, checked.

    python -m tools.promote --env prod --run awq-prod-20261124-101500 [--adapters-from PREFIX]
        [--dry-run]

(``make promote ENV=prod RUN=<run id>``). The candidate at
``<quantization.candidates_prefix>/<run id>/`` and the adapters of the prefix the deployed
endpoint serves (or ``--adapters-from``) are copied, server-side, to ``llm.model.artifact_prefix``
— which must not be the served prefix — each object encrypted with the project key and carrying
its SHA-256; the target's ``artifact-manifest.json`` goes last. Everything is checked first
(tools/promote/checks.py says what); a re-run after an interruption copies only what is missing.
Then ``make deploy`` rolls the endpoint to it (blue/green, with its rollback alarms), after the
preflight has checked it again.

Exit status: 0 promoted (or already promoted), 1 AWS refused or failed (re-run), 2 refused by a
check or a bad argument.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from quantization import job_outputs
from stacks.artifact_layout import artifact_layout
from stacks.settings import CONFIG_DIR, EnvironmentSettings, SettingsError, load_settings
from tools.aws_context import (
    EXIT_AWS,
    EXIT_OK,
    EXIT_REFUSED,
    DeployToolError,
    account_problem,
    aws_session,
    caller_account,
    environment_parser,
    project_key_arn,
    stack_outputs,
)
from tools.preflight.__main__ import list_artifact
from tools.preflight.checks import ObjectHead
from tools.promote.checks import (
    GATE_REPORT,
    PromotionInputs,
    PromotionPlan,
    describe_plan,
    plan_promotion,
    prefix_artifact,
    target_problems,
)
from tools.publish.upload import SHA256_METADATA, human_bytes, transfer_config
from tools.quantize.plan import RUN_ID_PATTERN, candidate_prefix


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = environment_parser("python -m tools.promote", __doc__)
    parser.add_argument("--run", required=True, help="the quantization run id "
                        "(make quantize prints it: awq-<env>-<yyyymmdd>-<hhmmss>)")
    parser.add_argument("--adapters-from", help="prefix whose published adapters to copy "
                        "(default: the prefix the deployed LLM endpoint serves)")
    parser.add_argument("--dry-run", action="store_true", help="check and list the copies")
    return parser.parse_args(argv)


def read_text(s3: Any, bucket: str, key: str) -> str | None:
    """An object's text, or None when there is no such key."""
    from botocore.exceptions import ClientError

    try:
        return str(s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8"))
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise


def target_heads(s3: Any, bucket: str, keys: Sequence[str]) -> dict[str, ObjectHead | None]:
    """Head of each key (what a resumed promotion may skip)."""
    heads: dict[str, ObjectHead | None] = {}
    for key in keys:
        head = s3.head_object(Bucket=bucket, Key=key)
        heads[key] = ObjectHead(size=int(head["ContentLength"]),
                                sha256=head.get("Metadata", {}).get(SHA256_METADATA),
                                kms_key_id=head.get("SSEKMSKeyId"),
                                encryption=head.get("ServerSideEncryption"))
    return heads


def gather(settings: EnvironmentSettings, args: argparse.Namespace, s3: Any, bucket: str,
           served: str | None) -> PromotionInputs:
    """Everything the checks read, from S3."""
    candidate = prefix_artifact(f"candidate {args.run}", candidate_prefix(settings, args.run))
    source = args.adapters_from.strip("/") if args.adapters_from else served
    if source is None:
        raise DeployToolError(
            f"{settings.serving_stack_name} is not deployed, so no endpoint serves adapters to "
            "copy: give --adapters-from <prefix> (one make publish wrote)")
    target = prefix_artifact("llm", settings.llm.model.artifact_prefix)
    target_listing = list_artifact(s3, bucket, target)
    return PromotionInputs(
        run_id=args.run,
        candidate=list_artifact(s3, bucket, candidate),
        gate_report=read_text(s3, bucket, reports_key(settings, args.run)),
        candidate_config=read_text(s3, bucket, candidate.key("config.json")),
        adapters=list_artifact(s3, bucket, prefix_artifact("adapters", source)),
        target=target_listing,
        target_heads=target_heads(s3, bucket, target_listing.keys_under_prefix),
        served_prefix=served,
    )


def reports_key(settings: EnvironmentSettings, run_id: str) -> str:
    """The run's gate report in the reports prefix."""
    return f"{settings.quantization.reports_prefix}/{run_id}/{GATE_REPORT}"


def execute(plan: PromotionPlan, s3: Any, bucket: str, key_arn: str, expected_owner: str,
            out: TextIO) -> None:
    """Copy what is missing (server-side), then write the manifest."""
    config = transfer_config(part_size_mib=64, threads=8)
    count = len(plan.copies)
    for index, copy in enumerate(plan.copies, start=1):
        print(f"  [{index}/{count}] {copy.target_key} ({human_bytes(copy.digest.size)})",
              file=out, flush=True)
        s3.copy({"Bucket": bucket, "Key": copy.source_key}, bucket, copy.target_key,
                ExtraArgs={"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key_arn,
                           "Metadata": {SHA256_METADATA: copy.digest.sha256},
                           "MetadataDirective": "REPLACE",
                           "ExpectedBucketOwner": expected_owner},
                Config=config)
    body = plan.manifest.to_json().encode("utf-8")
    s3.put_object(Bucket=bucket, Key=plan.manifest_key, Body=body,
                  ContentType="application/json", ServerSideEncryption="aws:kms",
                  SSEKMSKeyId=key_arn, ExpectedBucketOwner=expected_owner,
                  Metadata={SHA256_METADATA: hashlib.sha256(body).hexdigest()})
    print(f"  manifest s3://{bucket}/{plan.manifest_key}", file=out, flush=True)


def promote(settings: EnvironmentSettings, args: argparse.Namespace, session: Any,
            out: TextIO) -> int:
    """Check, then copy; the exit status."""
    wrong_account = account_problem(settings, caller_account(session))
    if wrong_account:
        print(f"promote: refused: {wrong_account}", file=out)
        return EXIT_REFUSED
    serving = stack_outputs(session, settings.serving_stack_name) or {}
    served = serving.get(job_outputs.LLM_MODEL_PREFIX)
    refused = target_problems(settings, served)
    if refused:
        print(f"promote: refused: {refused[0]}", file=out)
        return EXIT_REFUSED
    key_arn = project_key_arn(session, settings)
    bucket = artifact_layout(settings).bucket
    s3 = session.client("s3")
    inputs = gather(settings, args, s3, bucket, served)
    plan, problems = plan_promotion(settings, inputs, bucket=bucket, project_key_arn=key_arn,
                                    reports_key=reports_key(settings, args.run))
    if plan is None:
        for problem in problems:
            print(f"promote: refused: {problem}", file=out)
        return EXIT_REFUSED
    target = f"s3://{bucket}/{plan.target_prefix}/"
    if not plan.copies and len(plan.already_there) == len(plan.manifest.files):
        print(f"promote: run {args.run} is already promoted to {target}", file=out)
        return EXIT_OK
    print(f"promote: run {args.run} -> {target}: {len(plan.copies)} to copy "
          f"({human_bytes(plan.total_bytes)}), {len(plan.already_there)} already there",
          file=out, flush=True)
    if args.dry_run:
        for line in describe_plan(plan, bucket):
            print(f"would {line}", file=out)
        return EXIT_OK
    execute(plan, s3, bucket, key_arn, settings.account, out)
    print(f"promote: done; {target} holds run {args.run} and the served adapters. Next: make "
          f"deploy ENV={settings.name} (its preflight checks the prefix; the endpoint rolls to "
          "it blue/green, with its rollback alarms)", file=out)
    return EXIT_OK


def main(argv: Sequence[str] | None = None, *, session: Any = None,
         out: TextIO = sys.stderr) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not RUN_ID_PATTERN.match(args.run):
        print(f"promote: refused: --run {args.run!r} is not accepted: a run id as make quantize "
              "prints it (awq-<env>-<yyyymmdd>-<hhmmss>)", file=out)
        return EXIT_REFUSED
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        settings = load_settings(args.env, config_dir=config_dir())
        return promote(settings, args, session or aws_session(settings), out)
    except SettingsError as error:
        print(f"promote: {error}", file=out)
        return EXIT_REFUSED
    except DeployToolError as error:
        print(f"promote: {error}", file=out)
        return EXIT_AWS
    except (BotoCoreError, ClientError) as error:
        print(f"promote: AWS refused: {error} (re-run to finish: copied files are skipped)",
              file=out)
        return EXIT_AWS


def config_dir() -> Path:
    """config/, or $MANGAASSIST_CONFIG_DIR (tests point it at edited copies)."""
    return Path(os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR))


if __name__ == "__main__":
    sys.exit(main())
