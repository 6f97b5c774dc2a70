"""The ids the policy-validation plugins use, and the bar for a reason (pure: no CDK import).

``stacks.nag`` registers the plugins and writes acknowledgements with these; the summary line of
``make synth`` (``checks/validation_summary.py``) reads the report with them without starting jsii.
"""

from __future__ import annotations

NAG_PACK = "AwsSolutions"
MIN_REASON_CHARS = 40

GUARD_PLUGIN = "cdk-validator-cfnguard"
"""The plugin's name in acknowledgement ids and in validation-report.json."""

GUARD_CONTROLS: dict[str, str] = {
    "CT.CLOUDWATCH.PR.1": "cloudwatch_alarm_action_check",
    "CT.CLOUDWATCH.PR.3": "cloudwatch_log_group_encrypted_check",
    "CT.LAMBDA.PR.3": "lambda_inside_vpc_check",
    "CT.S3.PR.2": "s3_bucket_logging_enabled_check",
    "CT.S3.PR.4": "s3_event_notifications_enabled_check",
    "CT.S3.PR.9": "s3_bucket_object_lock_enabled_check",
    "CT.S3.PR.10": "s3_bucket_default_encryption_kms_check",
    "CT.SQS.PR.2": "sqs_queue_encrypted_check",
}
"""Control Tower control id -> the cfn-guard rule that implements it (the bundled
``rules/control-tower/cfn-guard/**/ct-*.guard``), for the controls this app acknowledges on
some resource. The ones it fixed everywhere (CT.KMS.PR.3, CT.CLOUDWATCH.PR.2), and CT.SQS.PR.1,
which the failed-runs queue passes by stating SQS's default redrive permission, are not here, so
nothing can acknowledge them instead of fixing a new finding."""

UNREADABLE_VALUE = "the rule cannot read this valid template value"
"""How an acknowledgement of a rule that misreads a construct starts (the plugin's README: the
rules "accept a limited subset of CloudFormation syntax"): the property is set, to an intrinsic
such as ``Fn::GetStackOutput`` the rule does not resolve."""
