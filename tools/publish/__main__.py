"""`python -m tools.publish`: check, then upload the LLM and/or intent artifacts of one environment.

    python -m tools.publish --env prod --model ./llama-3-8b-instruct-w4a16 --adapters ./lora \
        --intent build/intent-inf1/model.tar.gz [--kms-key-arn ARN] [--part-size-mib 64]
        [--threads 8] [--dry-run]
    python -m tools.publish --env prod --show-layout

The LLM's model data is one artifact (base model + adapters + one manifest), so --model and
--adapters go together; --intent may be published alone. Everything is checked before anything
is uploaded; each problem is one line on stderr. Exit status: 0 published (or nothing to do),
1 AWS refused or failed (re-run: what is there already is skipped), 2 refused by a check or a
bad argument.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from stacks.artifact_layout import ArtifactLayout, artifact_layout
from stacks.settings import EnvironmentPlans, SettingsError, load_environment
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
)
from tools.publish.checks import (
    ArtifactUpload,
    check_adapters,
    check_base_model,
    check_intent_archive,
    intent_upload,
    llm_upload,
    unconfigured_adapters,
)
from tools.publish.upload import ArtifactPublisher, human_bytes, transfer_config


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = environment_parser("python -m tools.publish", __doc__)
    parser.add_argument("--model", type=Path, help="base model directory (config, tokenizer, "
                        "safetensors)")
    parser.add_argument("--adapters", type=Path, help="directory with one folder per adapter "
                        "(llm.adapters[].directory)")
    parser.add_argument("--intent", type=Path, help="neuron/compile.py's model.tar.gz")
    parser.add_argument("--kms-key-arn", help="project key (default: the Foundation stack's "
                        "ProjectKeyArn output)")
    parser.add_argument("--part-size-mib", type=int, default=64,
                        help="multipart part size and threshold, MiB (5..5120; default 64)")
    parser.add_argument("--threads", type=int, default=8,
                        help="parts uploaded in parallel (default 8)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check and list what would be uploaded; no AWS calls")
    parser.add_argument("--show-layout", action="store_true",
                        help="print the environment's artifact keys and exit")
    return parser.parse_args(argv)


def refusals(args: argparse.Namespace, settings: Any, plans: EnvironmentPlans) -> list[str]:
    """Argument and artifact problems, one line each; empty when everything can go."""
    problems: list[str] = []
    if not (args.model or args.adapters or args.intent):
        problems.append("nothing to publish: give --model and --adapters, --intent, or all three")
    if bool(args.model) != bool(args.adapters) and settings.llm.adapters:
        problems.append("--model and --adapters go together: the LLM's model data is one "
                        "artifact (base model, adapters, one manifest)")
    if not 5 <= args.part_size_mib <= 5120:
        problems.append(f"--part-size-mib {args.part_size_mib}: S3 parts are 5..5120 MiB")
    if args.threads < 1:
        problems.append(f"--threads {args.threads}: at least 1")
    if args.model:
        problems += check_base_model(args.model, settings.llm)
    if args.adapters:
        problems += check_adapters(args.adapters, settings.llm, plans.llm_memory)
    if args.intent:
        problems += check_intent_archive(args.intent, settings.intent)
    return problems


def plan(args: argparse.Namespace, settings: Any, layout: ArtifactLayout,
         out: TextIO) -> list[ArtifactUpload]:
    """Hash the files and say what goes where."""
    uploads: list[ArtifactUpload] = []
    if args.model:
        adapters_dir = args.adapters or args.model / "__no_adapters__"
        for folder in unconfigured_adapters(adapters_dir, settings.llm):
            print(f"note: ADAPTERS {adapters_dir / folder} is not in llm.adapters; not uploaded",
                  file=out)
        print("hashing the LLM's files (SHA-256) ...", file=out, flush=True)
        uploads.append(llm_upload(args.model, adapters_dir, settings.llm, layout))
    if args.intent:
        uploads.append(intent_upload(args.intent, layout))
    return uploads


def main(argv: Sequence[str] | None = None, *, session: Any = None,
         out: TextIO = sys.stderr) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        environment = load_environment(args.env)
    except SettingsError as error:
        print(f"publish: {error}", file=out)
        return EXIT_REFUSED
    settings = environment.settings
    layout = artifact_layout(settings)
    if args.show_layout:
        print(layout.describe(), file=sys.stdout)
        return EXIT_OK
    problems = refusals(args, settings, environment.plans)
    if problems:
        for problem in problems:
            print(f"publish: refused: {problem}", file=out)
        return EXIT_REFUSED
    uploads = plan(args, settings, layout, out)
    if args.dry_run:
        for upload in uploads:
            for local in upload.files:
                print(f"would upload s3://{layout.bucket}/{upload.artifact.key(local.relative)} "
                      f"({human_bytes(local.size)})", file=out)
            print(f"would write s3://{layout.bucket}/{upload.artifact.manifest_key}", file=out)
        return EXIT_OK
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        session = session or aws_session(settings)
        wrong_account = account_problem(settings, caller_account(session))
        if wrong_account:
            print(f"publish: refused: {wrong_account}", file=out)
            return EXIT_REFUSED
        key_arn = args.kms_key_arn or project_key_arn(session, settings)
        publisher = ArtifactPublisher(
            session.client("s3"), layout.bucket, kms_key_arn=key_arn,
            expected_owner=settings.account,
            config=transfer_config(part_size_mib=args.part_size_mib, threads=args.threads),
            out=out)
        for upload in uploads:
            result = publisher.publish(upload)
            print(f"{upload.artifact.endpoint}: {len(result.uploaded)} uploaded, "
                  f"{len(result.unchanged)} unchanged", file=out)
            for key in result.stale:
                print(f"warning: s3://{layout.bucket}/{key} is not in the manifest; SageMaker "
                      f"would copy it too: aws s3 rm s3://{layout.bucket}/{key}", file=out)
    except DeployToolError as error:
        print(f"publish: {error}", file=out)
        return EXIT_AWS
    except (BotoCoreError, ClientError) as error:
        print(f"publish: AWS refused: {error} (re-run to finish: uploaded files are skipped)",
              file=out)
        return EXIT_AWS
    print(f"publish: done; check with make preflight ENV={settings.name}", file=out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
