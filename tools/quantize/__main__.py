"""Run the AWQ quantization job (containers/quantize) as a SageMaker training job.

    python -m tools.quantize --env prod \
        --base-model-prefix base-models/Meta-Llama-3-8B-Instruct \
        [--group-size 128] [--instance-type ml.g5.4xlarge] [--poll-s 30] [--no-wait]

Runs in ``.venv-sagemaker`` (``make quantize``): the sagemaker SDK v3 (``ModelTrainer``) starts
the job with the image and role the Serving stack built, in the models' private subnets, with
the project key on the output (and on the training volume when the instance type has one: a
type with local NVMe storage, such as ml.g5.4xlarge, refuses a VolumeKmsKeyId). It finds them in
the stack outputs (CloudFormation DescribeStacks), waits with one progress line per status
change, then reads the run's ``quality_gate.json`` and prints the verdict. A passing run's model
is a candidate at ``<quantization.candidates_prefix>/<run id>/``, never the served prefix;
``make promote ENV=<env> RUN=<run id>`` copies it there, checked. Exit 0: the gate passed and
the candidate is complete; 1: the gate failed (nothing uploaded); 2: anything else (bad
arguments, a missing stack output, a job that failed before its gate).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from quantization import job_outputs
from stacks.settings import CONFIG_DIR, EnvironmentSettings, SettingsError, load_settings
from tools.quantize.plan import (
    TERMINAL_STATUSES,
    GateVerdict,
    JobPlan,
    LaunchError,
    StackOutputs,
    decide_outcome,
    new_run_id,
    plan_job,
    progress_line,
)

SDK_CONFIG = {"SchemaVersion": "1.0",
              "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}
"""No SDK telemetry calls from a deploy pipeline or a private network."""


def read_stack_outputs(cloudformation: Any, stage_name: str) -> StackOutputs:
    """DescribeStacks of the stage's Foundation and Serving stacks → the outputs the job needs."""
    outputs: dict[str, dict[str, str]] = {}
    for stack in job_outputs.REQUIRED:
        name = job_outputs.stack_name(stage_name, stack)
        try:
            described = cloudformation.describe_stacks(StackName=name)["Stacks"]
        except cloudformation.exceptions.ClientError as error:
            if "does not exist" in str(error):
                continue
            raise
        outputs[name] = {o["OutputKey"]: o["OutputValue"] for o in described[0].get("Outputs", [])}
    return StackOutputs.from_describe_stacks(stage_name, outputs)


def start_training_job(plan: JobPlan, boto_session: Any) -> str:
    """Create the training job with the sagemaker SDK; return its name."""
    # Imported here: the SDK is large and only this shell needs it.
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.training.configs import (
        Compute,
        InputData,
        Networking,
        OutputDataConfig,
        StoppingCondition,
    )
    from sagemaker.train import ModelTrainer

    # The SDK checks the role with iam:SimulatePrincipalPolicy, which cannot evaluate the
    # role's conditions (ec2:Vpc, kms:ViaService, cloudwatch:namespace) without a request
    # context and reports them as denials. The role is built and tested with the stacks.
    os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
    session = Session(boto_session=boto_session, sagemaker_config=SDK_CONFIG)
    trainer = ModelTrainer(
        sagemaker_session=session,
        role=plan.role_arn,
        base_job_name=plan.run_id,
        training_image=plan.image_uri,
        # None leaves VolumeSizeInGB and VolumeKmsKeyId out of the request (local storage).
        compute=Compute(instance_type=plan.instance_type, instance_count=1,
                        volume_size_in_gb=plan.volume_size_gb,
                        volume_kms_key_id=plan.volume_kms_key_arn),
        networking=Networking(subnets=list(plan.subnet_ids),
                              security_group_ids=list(plan.security_group_ids),
                              enable_network_isolation=False),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=plan.max_runtime_s),
        output_data_config=OutputDataConfig(s3_output_path=plan.output_path,
                                            kms_key_id=plan.kms_key_arn),
        input_data_config=[InputData(channel_name="model", data_source=plan.base_model_uri)],
        environment=dict(plan.environment),
        tags=[{"key": key, "value": value} for key, value in plan.tags.items()],
    )
    trainer.train(wait=False, logs=False)
    job = trainer._latest_training_job  # the SDK keeps the created job only here
    if job is None:
        raise LaunchError("the sagemaker SDK created no training job")
    return str(job.training_job_name)


def volume_description(plan: JobPlan) -> str:
    """The training volume in words, for the run's header."""
    if plan.volume_kms_key_arn is None:
        return "the instance's NVMe storage (hardware-encrypted; no VolumeKmsKeyId)"
    return f"EBS {plan.volume_size_gb} GB, encrypted with {plan.volume_kms_key_arn}"


def wait_for_job(sagemaker: Any, job_name: str, *, poll_s: float,
                 emit: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Poll DescribeTrainingJob until the job ends; print a line whenever its state changes."""
    started = clock()
    last = ""
    while True:
        description: dict[str, Any] = sagemaker.describe_training_job(TrainingJobName=job_name)
        line = progress_line(clock() - started, description)
        state = line.split("] ", 1)[1]
        if state != last:
            emit(line)
            last = state
        if description.get("TrainingJobStatus") in TERMINAL_STATUSES:
            return description
        sleep(poll_s)


def read_gate_verdict(s3: Any, plan: JobPlan) -> GateVerdict | None:
    """The run's quality_gate.json, or None when the job wrote none."""
    bucket, prefix = plan.report_bucket_and_prefix
    try:
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}quality_gate.json")["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return GateVerdict.from_report(body.decode("utf-8"))


def uploaded_keys(s3: Any, plan: JobPlan) -> frozenset[str]:
    """File names directly under the model prefix (adapters/ and deeper are not listed)."""
    bucket, prefix = plan.model_bucket_and_prefix
    names: set[str] = set()
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        names.update(item["Key"][len(prefix):] for item in page.get("Contents", []))
    return frozenset(names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.quantize",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="environment: config/<env>.yaml")
    parser.add_argument("--base-model-prefix", required=True,
                        help="prefix of the bf16 base model in the artifact bucket "
                             "(under quantization.base_model_root)")
    parser.add_argument("--group-size", type=int, default=None,
                        help="AWQ group size (default: what llm.model.quantization says)")
    parser.add_argument("--instance-type", default=None,
                        help="training instance (default: quantization.instance_type)")
    parser.add_argument("--poll-s", type=float, default=30.0, help="seconds between polls")
    parser.add_argument("--no-wait", action="store_true", help="start the job and return")
    args = parser.parse_args(argv)

    import boto3

    config_dir = Path(os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR))
    try:
        settings: EnvironmentSettings = load_settings(args.env, config_dir=config_dir)
        session = boto3.Session(region_name=settings.region)
        outputs = read_stack_outputs(session.client("cloudformation"), settings.stage_name)
        plan = plan_job(settings, outputs, base_model_prefix=args.base_model_prefix,
                        run_id=new_run_id(settings.name, dt.datetime.now(dt.UTC)),
                        group_size=args.group_size, instance_type=args.instance_type)
    except (SettingsError, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    print(f"quantization run {plan.run_id} ({settings.name}, {plan.instance_type})")
    print(f"  base model  {plan.base_model_uri}")
    print(f"  candidate   {plan.model_uri} (only if the gate passes; make promote serves it)")
    print(f"  reports     {plan.report_uri}")
    print(f"  volume      {volume_description(plan)}")
    job_name = start_training_job(plan, session)
    print(f"  job         {job_name}", flush=True)
    if args.no_wait:
        return 0

    sagemaker = session.client("sagemaker")
    description = wait_for_job(sagemaker, job_name, poll_s=args.poll_s,
                               emit=lambda line: print(line, flush=True))
    s3 = session.client("s3")
    try:
        verdict = read_gate_verdict(s3, plan)
    except LaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if verdict is not None:
        print(verdict.headline())
        print("\n".join(verdict.lines))
    keys = uploaded_keys(s3, plan) if verdict is not None and verdict.passed else frozenset()
    outcome = decide_outcome(description["TrainingJobStatus"], description.get("FailureReason"),
                             verdict, keys, plan.model_uri,
                             promote_hint=f"make promote ENV={settings.name} RUN={plan.run_id}")
    print(outcome.message, file=sys.stdout if outcome.exit_code == 0 else sys.stderr)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
