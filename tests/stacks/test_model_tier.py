"""Each model's tier — alarms, endpoint, scaling, dashboard entry — built by one ModelTier, which
also grants callers the right to invoke the endpoint and nothing more."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from stacks.model_tier import INVOKE_ACTIONS, ModelTier
from stacks.settings import load_environment, load_settings
from stacks.stage import MangaAssistStage
from stacks.synth import feature_flags


@pytest.fixture(scope="module")
def stage() -> MangaAssistStage:
    dev = load_environment("dev")
    return MangaAssistStage(cdk.App(context=feature_flags()), settings=dev.settings,
                            plans=dev.plans)


def test_the_parts_keep_their_ids_in_the_stack(stage: MangaAssistStage) -> None:
    """ModelTier is not a Construct: its parts sit where they always did, so their logical IDs
    — and the deployed resources behind them — did not change when the tier was introduced."""
    children = {child.node.id for child in stage.serving.node.children}
    for prefix in ("Llm", "Intent"):
        assert {f"{prefix}Alarms", f"{prefix}Endpoint", f"{prefix}Scaling"} <= children
    assert "Llm" not in children and "Intent" not in children


def test_each_tier_feeds_the_dashboard_and_the_scaling_publisher(stage: MangaAssistStage) -> None:
    serving = stage.serving
    assert [tier.dashboard_entry.kind for tier in (serving.llm, serving.intent)] == \
        ["llm", "intent"]
    assert serving.llm.resource_id == "endpoint/manga-assist-dev-llm/variant/AllTraffic"
    assert serving.llm.dashboard_entry.alarms is serving.llm.alarms


@pytest.fixture(scope="module")
def granted(stage: MangaAssistStage) -> dict:
    """The serving template after ``grant_invoke`` to one new role per tier."""
    serving = stage.serving
    for tier in ("llm", "intent"):
        caller = iam.Role(serving, f"Caller{tier}",
                          assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        model_tier: ModelTier = getattr(serving, tier)
        model_tier.grant_invoke(caller)
    return dict(Template.from_stack(serving).to_json())


@pytest.mark.parametrize("tier", ["llm", "intent"])
def test_grant_invoke_allows_calls_to_this_endpoint_only(granted: dict, tier: str) -> None:
    (policy,) = [resource for resource in granted["Resources"].values()
                 if resource["Type"] == "AWS::IAM::Policy"
                 and any(ref.get("Ref", "").startswith(f"Caller{tier}")
                         for ref in resource["Properties"]["Roles"])]
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Allow"
    assert sorted(statement["Action"]) == sorted(INVOKE_ACTIONS)
    settings = load_settings("dev")
    assert statement["Resource"] == (f"arn:aws:sagemaker:{settings.region}:{settings.account}:"
                                     f"endpoint/manga-assist-dev-{tier}")
