"""`python -m tools.preflight --env <env>`: is this account ready for the Serving stack?

    python -m tools.preflight --env prod [--assembly cdk.out]

Checks, with boto3 in the environment's account and region, each problem one line naming the fix
(tools/preflight/checks.py says why each matters):

1. the credentials are for the account the settings name (sts get-caller-identity);
2. the CDK bootstrap: CDKToolkit usable, its version (SSM /cdk-bootstrap/<qualifier>/version) at
   least what the synthesized templates require (their CheckBootstrapVersion rule);
3. the Foundation stack is deployed (its outputs name the project key);
4. every artifact the endpoints read is in the bucket and matches its artifact-manifest.json;
5. SageMaker service quotas cover each variant's maximum plus a blue/green green fleet, summed
   over every environment of config/ deployed to the same account and region, and one
   quantization training instance per environment.

`make deploy` runs it between the Foundation and the Serving stack, so a Serving deployment never
starts over missing model data (which would fail only after SageMaker's download and start-up
timeouts, 15-20 minutes each, and roll back). Exit status: 0 ready, 1 problems found, 2 the
check itself could not run (no credentials, no synthesized templates).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from stacks.artifact_layout import ArtifactLayout, ModelArtifact, artifact_layout
from stacks.settings import (
    CONFIG_DIR,
    REPO_ROOT,
    EnvironmentSettings,
    SettingsError,
    available_environments,
    load_environments,
    load_settings,
)
from tools.aws_context import (
    PROJECT_KEY_OUTPUT,
    DeployToolError,
    account_problem,
    aws_session,
    caller_account,
    environment_parser,
    stack_outputs,
)
from tools.preflight.checks import (
    TOOLKIT_STACK,
    ArtifactListing,
    BootstrapRequirement,
    ObjectHead,
    artifact_problems,
    bootstrap_problem,
    bootstrap_requirement,
    parse_listing_manifest,
    quota_needs,
    quota_problems,
)
from tools.publish.upload import SHA256_METADATA

EXIT_READY, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2


def read_requirement(assembly: Path, stage_name: str) -> BootstrapRequirement:
    """The bootstrap requirement of one stage's synthesized stacks (cdk.out)."""
    root_manifest = assembly / "manifest.json"
    if not root_manifest.is_file():
        raise DeployToolError(f"no cloud assembly at {assembly}: run make synth first "
                              "(make preflight and make deploy do)")
    artifacts = json.loads(root_manifest.read_text(encoding="utf-8")).get("artifacts", {})
    nested = [a for a in artifacts.values() if a.get("type") == "cdk:cloud-assembly"
              and a.get("properties", {}).get("displayName") == stage_name]
    if not nested:
        raise DeployToolError(f"{assembly} has no stage {stage_name}: run make synth")
    directory = assembly / nested[0]["properties"]["directoryName"]
    stage = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))["artifacts"]
    templates: list[dict[str, Any]] = []
    versions: list[int] = []
    for artifact in stage.values():
        props = artifact.get("properties", {})
        if "requiresBootstrapStackVersion" in props:
            versions.append(int(props["requiresBootstrapStackVersion"]))
        if artifact.get("type") == "aws:cloudformation:stack":
            templates.append(json.loads((directory / props["templateFile"]).read_text("utf-8")))
    return bootstrap_requirement(templates, versions)


def _error_code(error: Any) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def deployed_bootstrap_version(session: Any, parameter: str) -> str | None:
    from botocore.exceptions import ClientError

    try:
        return str(session.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"])
    except ClientError as error:
        if _error_code(error) == "ParameterNotFound":
            return None
        raise


def toolkit_status(session: Any) -> str | None:
    from botocore.exceptions import ClientError

    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=TOOLKIT_STACK)
    except ClientError as error:
        if "does not exist" in str(error):
            return None
        raise
    return str(stacks["Stacks"][0]["StackStatus"])


def list_artifact(s3: Any, bucket: str, artifact: ModelArtifact) -> ArtifactListing:
    """The manifest, the heads of the files it lists, and every key under the prefix."""
    from botocore.exceptions import ClientError

    try:
        body = s3.get_object(Bucket=bucket, Key=artifact.manifest_key)["Body"].read()
        text: str | None = body.decode("utf-8")
    except ClientError as error:
        if _error_code(error) not in ("NoSuchKey", "404"):
            raise
        text = None
    listing = ArtifactListing(artifact, text, {})
    try:
        manifest = parse_listing_manifest(listing, bucket)
    except ValueError:
        return listing  # artifact_problems reports the malformed manifest
    heads: dict[str, ObjectHead | None] = {}
    for relative in sorted(manifest.all_files) if manifest else []:
        key = artifact.key(relative)
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
        except ClientError as error:
            if _error_code(error) not in ("404", "NoSuchKey", "NotFound"):
                raise
            heads[key] = None
            continue
        heads[key] = ObjectHead(size=int(head["ContentLength"]),
                                sha256=head.get("Metadata", {}).get(SHA256_METADATA),
                                kms_key_id=head.get("SSEKMSKeyId"),
                                encryption=head.get("ServerSideEncryption"))
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                             Prefix=f"{artifact.read_prefix}/"):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return ArtifactListing(artifact, text, heads, tuple(keys))


def sagemaker_quotas(session: Any, names: Sequence[str]) -> dict[str, tuple[float, str] | None]:
    """(value, quota code) of each named SageMaker quota: applied values, else AWS defaults."""
    client = session.client("service-quotas")
    found: dict[str, tuple[float, str] | None] = dict.fromkeys(names)
    for operation in ("list_service_quotas", "list_aws_default_service_quotas"):
        if all(found.values()):
            break
        for page in client.get_paginator(operation).paginate(ServiceCode="sagemaker"):
            for quota in page.get("Quotas", []):
                name = quota.get("QuotaName")
                if name in found and found[name] is None:
                    found[name] = (float(quota["Value"]), str(quota["QuotaCode"]))
    return found


def run_preflight(settings: EnvironmentSettings, session: Any, assembly: Path,
                  out: TextIO) -> list[str]:
    """Every problem, one line each; prints what passed as it goes."""
    account = caller_account(session)
    problem = account_problem(settings, account)
    if problem:
        return [problem]  # everything else would be read from the wrong account
    print(f"ok: credentials for account {account}, region {settings.region}", file=out)
    problems: list[str] = []

    requirement = read_requirement(assembly, settings.stage_name)
    deployed = deployed_bootstrap_version(session, requirement.ssm_parameter)
    problem = bootstrap_problem(requirement, deployed_version=deployed,
                                toolkit_status=toolkit_status(session), account=account,
                                region=settings.region)
    if problem:
        problems.append(problem)
    else:
        print(f"ok: CDK bootstrap version {deployed} (the templates need "
              f"{requirement.version})", file=out)

    outputs = stack_outputs(session, settings.foundation_stack_name)
    if outputs is None or PROJECT_KEY_OUTPUT not in outputs:
        problems.append(f"stack {settings.foundation_stack_name} is not deployed: make deploy "
                        f"ENV={settings.name} deploys it first")
    else:
        problems += check_artifacts(settings, artifact_layout(settings), session,
                                    outputs[PROJECT_KEY_OUTPUT], out)

    needs = quota_needs(settings, sibling_environments(settings))
    quota_lines = quota_problems(needs, sagemaker_quotas(session, [n.quota_name for n in needs]),
                                 region=settings.region)
    problems += quota_lines
    if not quota_lines:
        print("ok: SageMaker quotas: " + ", ".join(
            f"{n.quota_name} >= {n.instances}" for n in needs), file=out)
    return problems


def config_dir() -> Path:
    """config/, or $MANGAASSIST_CONFIG_DIR."""
    return Path(os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR))


def sibling_environments(settings: EnvironmentSettings) -> list[EnvironmentSettings]:
    """Every environment of the config directory in ``settings``' account and region (their
    endpoints draw on the same quotas)."""
    every = load_environments(available_environments(config_dir()), config_dir=config_dir())
    return [env for env in every if (env.account, env.region) == (settings.account,
                                                                   settings.region)]


def check_artifacts(settings: EnvironmentSettings, layout: ArtifactLayout, session: Any,
                    project_key: str, out: TextIO) -> list[str]:
    s3 = session.client("s3")
    problems: list[str] = []
    for artifact in layout.artifacts():
        found = artifact_problems(list_artifact(s3, layout.bucket, artifact),
                                  bucket=layout.bucket, project_key_arn=project_key,
                                  environment=settings.name)
        problems += found
        if not found:
            print(f"ok: {artifact.endpoint} artifacts match "
                  f"s3://{layout.bucket}/{artifact.manifest_key}", file=out)
    return problems


def main(argv: Sequence[str] | None = None, *, session: Any = None,
         out: TextIO = sys.stderr) -> int:
    parser = environment_parser("python -m tools.preflight", __doc__)
    parser.add_argument("--assembly", type=Path, default=REPO_ROOT / "cdk.out",
                        help="synthesized cloud assembly (default cdk.out)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        settings = load_settings(args.env, config_dir=config_dir())
        problems = run_preflight(settings, session or aws_session(settings), args.assembly, out)
    except (SettingsError, DeployToolError) as error:
        print(f"preflight: {error}", file=out)
        return EXIT_ERROR
    except (BotoCoreError, ClientError) as error:
        print(f"preflight: AWS refused a read: {error}", file=out)
        return EXIT_ERROR
    for problem in problems:
        print(f"preflight: {problem}", file=out)
    if problems:
        print(f"preflight: {len(problems)} problem(s); fix them before the Serving stack is "
              f"deployed (make deploy ENV={settings.name} runs this check again)", file=out)
        return EXIT_PROBLEMS
    print(f"preflight: ready to deploy {settings.serving_stack_name}", file=out)
    return EXIT_READY


if __name__ == "__main__":
    sys.exit(main())
