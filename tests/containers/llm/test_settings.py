"""Settings: defaults, every problem reported by name, and the stack's environment accepted."""

from __future__ import annotations

import pytest

from gateway.settings import (
    SETTING_SPECS,
    SettingsError,
    load_settings,
    settings_reference_markdown,
)
from serving_contract import normalize_locale
from tests.containers.llm.harness import REPO_ROOT


def test_defaults_are_valid_and_match_the_seed_split() -> None:
    settings = load_settings({})
    split = settings.gateway.context_split
    window = settings.engine.max_model_len
    assert (split.system * window, split.rag * window, split.history * window,
            split.output * window) == (512, 1024, 2048, 512)  # docs/design-decisions.md#context-split
    assert settings.adapter_names() == ("manga", "support", "manga-ja")
    assert settings.gateway.routing_table["order_tracking"] == "support"
    assert settings.gateway.locale_routes == {("ja-JP", "manga"): "manga-ja"}
    assert settings.gateway.request_deadline_s < 60


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GATEWAY_ADMISION_WATERMARK": "0.5"},
         "GATEWAY_ADMISION_WATERMARK: not a known setting (did you mean "
         "GATEWAY_ADMISSION_WATERMARK?)"),
        ({"GATEWAY_ADMISSION_WATERMARK": "1.5"},
         "GATEWAY_ADMISSION_WATERMARK='1.5': expected a number in (0, 1]"),
        ({"ENGINE_MAX_MODEL_LEN": "lots"}, "ENGINE_MAX_MODEL_LEN='lots': expected an integer"),
        ({"GATEWAY_REQUEST_DEADLINE_S": "60"}, "GATEWAY_REQUEST_DEADLINE_S='60'"),
        ({"GATEWAY_CONTEXT_SPLIT": "system=0.5,rag=0.5,history=0.5,output=0.1"},
         "shares add up to 1.6; they must add up to at most 1"),
        ({"GATEWAY_CONTEXT_SPLIT": "system=0.1,rag=0.1,history=0.5"}, "missing share(s): output"),
        ({"GATEWAY_ROUTING_TABLE": "shipping=manga"}, "keys are intents: product_question"),
        ({"GATEWAY_ROUTING_TABLE": "faq=anime"}, "values are served adapters or 'base'"),
        ({"GATEWAY_LOCALE_ROUTES": "ja-JP:manga=nope"}, "GATEWAY_LOCALE_ROUTES"),
        ({"GATEWAY_BUCKET_BOUNDS": "S=512,M=1024,L=2048"},
         "GATEWAY_BUCKET_BOUNDS: no longer a setting: the bucket bounds follow ENGINE_MAX_MODEL_LEN"),
        ({"GATEWAY_BUCKET_CAPS": "S=1,M=1,L=1"}, "all of S, M, L, XL are required"),
        ({"GATEWAY_ADAPTERS": "base=x"}, "GATEWAY_ADAPTERS='base'"),
        ({"ENGINE_BLOCK_SIZE": "12"}, "ENGINE_BLOCK_SIZE=12: one of 16, 32, 64, 128"),
        ({"ENGINE_BLOCK_SIZE": "8"}, "ENGINE_BLOCK_SIZE=8: one of 16, 32, 64, 128"),
        ({"ENGINE_KV_CACHE_DTYPE": "fp4"}, "ENGINE_KV_CACHE_DTYPE='fp4': one of auto, bfloat16"),
        ({"ENGINE_QUANTIZATION": "gptq"}, "ENGINE_QUANTIZATION='gptq': one of awq, awq_marlin"),
        ({"ENGINE_MAX_LORA_RANK": "48"}, "ENGINE_MAX_LORA_RANK=48"),
        ({"ENGINE_GPU_MEMORY_UTILIZATION": "0.99"}, "expected a number in (0, 0.95]"),
        ({"GATEWAY_TEST_MODE": "maybe"}, "GATEWAY_TEST_MODE='maybe': expected true or false"),
        ({"ENGINE_MAX_CPU_LORAS": "2"}, "must be at least ENGINE_MAX_LORAS=4"),
        ({"GATEWAY_ADMISSION_WAIT_S": "55"}, "must be below GATEWAY_REQUEST_DEADLINE_S=50"),
        ({"GATEWAY_DRAIN_TIMEOUT_S": "30"}, "GATEWAY_DRAIN_TIMEOUT_S='30'"),
    ],
)
def test_each_bad_setting_is_named_with_its_value(env: dict[str, str], expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env)
    assert expected in str(caught.value)


@pytest.mark.parametrize("window", [2048, 4096, 8192])
def test_bucket_bounds_are_the_shared_definition_for_the_engine_window(window: int) -> None:
    from request_buckets import bucket_bounds

    bounds = load_settings({"ENGINE_MAX_MODEL_LEN": str(window)}).gateway.buckets.bounds
    assert bounds == bucket_bounds(window)
    assert (bounds.s_max, bounds.m_max, bounds.l_max) == (window // 8, window // 4, window // 2)


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"ENGINE_MAX_MODEL_LEN": "x", "GATEWAY_RETRY_AFTER_S": "0",
                       "GATEWAY_BREAKER_CONTEXT_FACTOR": "0"})
    message = str(caught.value)
    for name in ("ENGINE_MAX_MODEL_LEN", "GATEWAY_RETRY_AFTER_S", "GATEWAY_BREAKER_CONTEXT_FACTOR"):
        assert name in message


def test_locale_routes_accept_the_stacks_grouped_form() -> None:
    settings = load_settings({
        "GATEWAY_ADAPTERS": "manga=m,support=s,manga-ja=mj,support-ja=sj",
        "GATEWAY_LOCALE_ROUTES": "ja-jp:manga=manga-ja,support=support-ja;ko-KR:manga=base",
    })
    assert settings.gateway.locale_routes == {
        ("ja-JP", "manga"): "manga-ja", ("ja-JP", "support"): "support-ja",
        ("ko-KR", "manga"): "base",
    }
    assert normalize_locale("zh-hant-tw") == "zh-Hant-TW"


def test_the_stacks_container_environment_is_accepted() -> None:
    """The CDK stack's environment for every configured environment loads without error."""
    from stacks.llm_endpoint import container_environment
    from stacks.settings import load_settings as load_stack_settings

    for name in ("dev", "prod"):
        llm = load_stack_settings(name).llm
        environment = container_environment(llm, llm.capacity_plan(), endpoint_name="ep",
                                             variant_name="AllTraffic")
        settings = load_settings(environment)
        assert settings.gateway.metrics_endpoint_name == "ep"
        assert settings.engine.max_model_len == int(environment["ENGINE_MAX_MODEL_LEN"])
        assert settings.gateway.expected_kv_tokens == int(environment["GATEWAY_EXPECTED_KV_TOKENS"])


def test_docs_list_every_setting() -> None:
    docs = (REPO_ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    missing = [spec.env for spec in SETTING_SPECS if f"`{spec.env}`" not in docs]
    assert not missing, f"docs/gateway.md does not mention {missing}"
    assert settings_reference_markdown().count("\n") == len(SETTING_SPECS) + 1
