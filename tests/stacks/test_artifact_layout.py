"""One function computes the artifact keys; the synthesized models and roles use exactly them."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from stacks.artifact_layout import artifact_layout
from stacks.settings import REPO_ROOT, SettingsError, load_settings, parse_settings


def test_production_keys() -> None:
    layout = artifact_layout(load_settings("prod"))
    assert layout.bucket == "manga-assist-prod-models-123456789012-ap-northeast-1"
    assert layout.llm.model_data_key == "models/llama-3-8b-instruct-awq/"
    assert layout.llm.manifest_key == "models/llama-3-8b-instruct-awq/artifact-manifest.json"
    assert dict(layout.llm_adapter_dirs) == {"manga": "adapters/manga_domain",
                                             "support": "adapters/general_support",
                                             "manga-ja": "adapters/jp_translation"}
    assert layout.intent.model_data_key == (
        "models/intent/distilbert-manga-intent-inf1/model.tar.gz")
    assert layout.intent.read_prefix == "models/intent/distilbert-manga-intent-inf1"
    assert layout.intent_archive_name == "model.tar.gz"


def _props(template: dict[str, Any], kind: str, prefix: str) -> dict[str, Any]:
    (found,) = [r["Properties"] for k, r in template["Resources"].items()
                if r["Type"] == kind and k.startswith(prefix)]
    return found


@pytest.mark.parametrize("stage", ["Dev", "Prod"])
def test_the_stacks_read_the_layouts_keys(synthesized, stage: str) -> None:  # type: ignore[no-untyped-def]
    layout = artifact_layout(load_settings(stage.lower()))
    serving = synthesized.template(f"{stage}/Serving")
    llm = _props(serving, "AWS::SageMaker::Model", "LlmEndpoint")["PrimaryContainer"]
    assert llm["ModelDataSource"]["S3DataSource"]["S3Uri"] == (
        f"s3://{layout.bucket}/{layout.llm.model_data_key}")
    intent = _props(serving, "AWS::SageMaker::Model", "IntentEndpoint")["PrimaryContainer"]
    assert intent["ModelDataUrl"] == f"s3://{layout.bucket}/{layout.intent.model_data_key}"
    for prefix, artifact in (("LlmEndpoint", layout.llm), ("IntentEndpoint", layout.intent)):
        statements = [s for r in serving["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                      and any(ref["Ref"].startswith(f"{prefix}ExecutionRole")
                              for ref in r["Properties"]["Roles"])
                      for s in r["Properties"]["PolicyDocument"]["Statement"]]
        (read,) = [s for s in statements if s.get("Sid") == "ReadModelData"]
        assert read["Resource"] == f"arn:aws:s3:::{layout.bucket}/{artifact.read_prefix}/*"
        assert artifact.manifest_key.startswith(f"{artifact.read_prefix}/"), \
            "the role must be able to read its artifact's manifest"


def _dev(**intent: Any) -> dict[str, Any]:
    data = yaml.safe_load((REPO_ROOT / "config" / "dev.yaml").read_text())
    data["intent"].update(intent)
    return data


def test_an_archive_outside_a_folder_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"intent\.artifact_key: 'model\.tar\.gz' is not "
                                            r"accepted: must lie in a folder"):
        parse_settings(_dev(artifact_key="model.tar.gz"), source="config/dev.yaml")


def test_the_intent_archive_may_not_sit_inside_the_llms_prefix() -> None:
    with pytest.raises(SettingsError, match="overlap: SageMaker copies the LLM's whole prefix"):
        parse_settings(_dev(artifact_key="models/llama-3-8b-instruct-awq/intent/model.tar.gz"),
                       source="config/dev.yaml")
