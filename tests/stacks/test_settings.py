"""Settings: every field validated, every error names the file, the field and the value."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.settings import (
    EnvironmentSettings,
    SettingsError,
    load_environments,
    load_settings,
    parse_settings,
)

CONFIG = Path(__file__).resolve().parents[2] / "config"


def base() -> dict[str, Any]:
    return yaml.safe_load((CONFIG / "dev.yaml").read_text())


def set_path(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def error_for(data: dict[str, Any]) -> str:
    with pytest.raises(SettingsError) as info:
        parse_settings(data, source="config/dev.yaml")
    return str(info.value)


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_shipped_environments_load(name: str) -> None:
    settings = load_settings(name)
    assert isinstance(settings, EnvironmentSettings)
    assert settings.name == name
    assert settings.account == "123456789012"
    assert settings.region == "ap-northeast-1"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("account", "12345", "account: '12345' is not accepted"),
        ("delivery.github_repository", "mangaassist", "delivery.github_repository: 'mangaassist' is not accepted"),
        ("delivery.deploy_role_arn", "deploy-role", "delivery.deploy_role_arn: 'deploy-role' is not accepted"),
        ("smoke.llm_time_to_first_token_ms", 0, "smoke.llm_time_to_first_token_ms: 0 is not accepted"),
        ("smoke.min_intent_agreement", 1.5, "smoke.min_intent_agreement: 1.5 is not accepted"),
        ("quantization.instance_type", "ml.inf1.xlarge", "quantization.instance_type: 'ml.inf1.xlarge' is not accepted: is not a GPU instance; AWQ calibration needs one"),
        ("quantization.base_model_root", "models", "quantization.base_model_root: 'models' overlaps the model prefix 'models/llama-3-8b-instruct-awq'"),
        ("quantization.candidates_prefix", "models/intent", "quantization.candidates_prefix: 'models/intent' overlaps the intent model"),
        ("quantization.candidates_prefix", "models/llama-3-8b-instruct-awq/runs", "quantization.candidates_prefix: 'models/llama-3-8b-instruct-awq/runs' overlaps the model prefix 'models/llama-3-8b-instruct-awq'"),
        ("quantization.candidates_prefix", "quantization", "quantization.reports_prefix: 'quantization/runs' overlaps quantization.candidates_prefix 'quantization'"),
        ("quantization.reports_prefix", "base-models/runs", "quantization.reports_prefix: 'base-models/runs' overlaps quantization.base_model_root 'base-models'"),
        ("llm.model.artifact_prefix", "weights/llama-3-8b", "llm.model.artifact_prefix: 'weights/llama-3-8b' is not under artifacts.models_prefix 'models', the only prefix the deploy role reads and publishes; accepted: models/<name>"),
        ("intent.artifact_key", "intent/model.tar.gz", "intent.artifact_key: 'intent/model.tar.gz' is not under artifacts.models_prefix 'models'"),
        ("artifacts.models_prefix", "served", "llm.model.artifact_prefix: 'models/llama-3-8b-instruct-awq' is not under artifacts.models_prefix 'served'"),
        ("quantization.candidates_prefix", "models/candidates", "quantization.candidates_prefix: 'models/candidates' overlaps artifacts.models_prefix 'models', where the deploy role reads and writes; accepted: a prefix outside it"),
        ("account", 123456789012, "account: 123456789012 is not accepted"),
        ("region", "tokyo", "region: 'tokyo' is not accepted: must look like ap-northeast-1"),
        ("region", "xx-nowhere-9", "region: 'xx-nowhere-9' is not accepted: must be one of"),
        ("name", "Dev Env", "name: 'Dev Env' is not accepted"),
        ("stage_name", "dev", "stage_name: 'dev' is not accepted"),
        ("alerts.email_subscribers", ["not-an-address"], "alerts.email_subscribers[0]: 'not-an-address'"),
        ("alerts.email_subscribers", "ops@example.com", "alerts.email_subscribers: 'ops@example.com'"),
        ("artifacts.removal_policy", "keep", "artifacts.removal_policy: 'keep' is not accepted: Input should be 'retain' or 'destroy'"),
        ("artifacts.noncurrent_version_expiration_days", -1, "artifacts.noncurrent_version_expiration_days: -1 is not accepted: Input should be greater than or equal to 1"),
        ("artifacts.access_log_retention_days", "a year", "artifacts.access_log_retention_days: 'a year' is not accepted"),
        ("tags", {"Project": ""}, "tags.Project: '' is not accepted"),
    ],
)
def test_bad_value_names_file_field_and_value(path: str, value: Any, expected: str) -> None:
    message = error_for(set_path(base(), path, value))
    assert message.startswith("config/dev.yaml: ")
    assert expected in message


def test_unknown_key_is_an_error_that_lists_accepted_keys() -> None:
    message = error_for(set_path(base(), "artifacts.noncurrent_version_expiry_days", 5))
    assert "artifacts.noncurrent_version_expiry_days: unknown key (typo?)" in message
    assert "noncurrent_version_expiration_days" in message  # the accepted spelling is offered


def test_unknown_top_level_key() -> None:
    message = error_for({**base(), "regoin": "us-east-1"})
    assert "config/dev.yaml: regoin: unknown key" in message
    assert "region" in message


def test_missing_required_field() -> None:
    data = base()
    del data["account"]
    assert "account: required field is missing" in error_for(data)


def test_every_problem_is_reported_not_just_the_first() -> None:
    data = set_path(set_path(base(), "account", "x"), "region", "mars-1")
    message = error_for(data)
    assert "account:" in message
    assert "region:" in message
    assert len(message.splitlines()) == 2


def test_settings_are_immutable() -> None:
    settings = load_settings("dev")
    with pytest.raises(Exception, match="frozen"):
        settings.region = "us-east-1"  # type: ignore[misc]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_missing_environment_file_lists_available(tmp_path: Path) -> None:
    write(tmp_path, "dev", (CONFIG / "dev.yaml").read_text())
    with pytest.raises(SettingsError, match=r"staging.yaml: no such environment file; available environments: dev"):
        load_settings("staging", config_dir=tmp_path)


def test_broken_yaml_is_reported_with_the_file(tmp_path: Path) -> None:
    write(tmp_path, "dev", "name: dev\naccount: [unclosed\n")
    with pytest.raises(SettingsError, match=r"dev.yaml: not valid YAML"):
        load_settings("dev", config_dir=tmp_path)


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    write(tmp_path, "dev", "- just\n- a list\n")
    with pytest.raises(SettingsError, match=r"dev.yaml: must be a mapping of settings, got list"):
        load_settings("dev", config_dir=tmp_path)


def test_name_must_match_file(tmp_path: Path) -> None:
    write(tmp_path, "qa", (CONFIG / "dev.yaml").read_text())
    with pytest.raises(SettingsError, match=r"qa.yaml: name: 'dev' is not accepted: must equal the file name 'qa'"):
        load_settings("qa", config_dir=tmp_path)


def test_load_environments_reports_all_broken_files(tmp_path: Path) -> None:
    write(tmp_path, "dev", (CONFIG / "dev.yaml").read_text().replace('"123456789012"', '"1"'))
    write(tmp_path, "prod", (CONFIG / "prod.yaml").read_text().replace("ap-northeast-1", "tokyo"))
    with pytest.raises(SettingsError) as info:
        load_environments(["dev", "prod"], config_dir=tmp_path)
    assert "dev.yaml: account" in str(info.value)
    assert "prod.yaml: region" in str(info.value)


def test_duplicate_stage_names_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "dev", (CONFIG / "dev.yaml").read_text())
    write(tmp_path, "qa", (CONFIG / "dev.yaml").read_text().replace("name: dev", "name: qa"))
    with pytest.raises(SettingsError, match="stage_name 'Dev' is used by more than one environment"):
        load_environments(["dev", "qa"], config_dir=tmp_path)


# --- the LLM endpoint, its scaling and the GPU budget ------------------------------------------

@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("llm.instance_type", "ml.g9.huge", "llm.instance_type: 'ml.g9.huge' is not accepted"),
        ("llm.instance_type", "ml.inf1.xlarge", "is an inferentia instance; the vLLM endpoint needs a GPU instance"),
        ("llm.max_model_len", 100, "llm.max_model_len: 100 is not accepted: Input should be greater than or equal to 256"),
        ("llm.model.quantization", "int3", "llm.model.quantization: 'int3' is not accepted: quantization 'int3' is not known"),
        ("llm.model.config", "config/models/nope.json", "llm.model.config: 'config/models/nope.json' is not accepted: no such file; available: config/models/llama-3-70b-instruct.json"),
        ("llm.scaling.min_capacity", -1, "llm.scaling.min_capacity: -1 is not accepted: Input should be greater than or equal to 1"),
        ("llm.scaling.max_capacity", 0, "llm.scaling.max_capacity: 0 is not accepted"),
        ("llm.scaling.time_zone", "Tokyo/Japan", "llm.scaling.time_zone: 'Tokyo/Japan' is not accepted: is not an IANA time zone"),
        ("llm.scaling.off_peak.start", "25:00", "llm.scaling.off_peak.start: '25:00' is not accepted"),
        ("llm.engine.gpu_memory_utilization", 0.99, "llm.engine.gpu_memory_utilization: 0.99 is not accepted: Input should be less than or equal to 0.95"),
        ("llm.deployment.canary_percent", 80, "llm.deployment.canary_percent: 80 is not accepted"),
        ("llm.health.container_startup_health_check_timeout_s", 30, "llm.health.container_startup_health_check_timeout_s: 30 is not accepted"),
        ("llm.routing.product_questions", "manga", "llm.routing: unknown intent(s) product_questions"),
        ("llm.routing.faq", "nope", "llm: routing.faq: 'nope' is not a configured adapter"),
        ("network.availability_zone_count", 5, "network.availability_zone_count: 5 is not accepted"),
    ],
)
def test_bad_llm_value_names_the_field(path: str, value: Any, expected: str) -> None:
    assert expected in error_for(set_path(base(), path, value))


@pytest.mark.parametrize(("name", "expected"), [
    ("base", "llm: adapters: 'base' is reserved"),
    ("auto", "llm: adapters: 'auto' is reserved"),
    ("Manga", "llm.adapters[0].name: 'Manga' is not accepted"),
])
def test_an_adapter_name_the_gateway_cannot_serve_is_refused(name: str, expected: str) -> None:
    data = base()
    data["llm"]["adapters"][0]["name"] = name
    data["llm"]["routing"] = {}
    data["llm"]["locale_routes"] = {}
    assert expected in error_for(data)


def test_scaling_min_above_max() -> None:
    data = set_path(base(), "llm.scaling.min_capacity", 3)
    message = error_for(data)
    assert "llm.scaling: min_capacity 3 is above max_capacity 2" in message


def test_a_daily_window_takes_no_capacity_figures() -> None:
    # The minima and maxima are the capacity model's: typing them is refused, not ignored.
    data = set_path(base(), "llm.scaling.business_hours", {"start": "08:00", "min_capacity": 1,
                                                           "max_capacity": 9})
    message = error_for(data)
    assert "llm.scaling.business_hours.min_capacity: unknown key" in message
    assert "accepted keys here: start, surge_allowance" in message


@pytest.mark.parametrize("field", ["target_invocations_per_instance_per_min",
                                   "target_concurrent_requests_per_model"])
def test_scaling_takes_no_target_of_its_own(field: str) -> None:
    assert f"llm.scaling.{field}: unknown key" in error_for(
        set_path(base(), f"llm.scaling.{field}", 200))


def test_step_bands_must_be_contiguous() -> None:
    data = set_path(base(), "llm.scaling.step_scaling.bands", [
        {"lower": 0, "upper": 1, "add_instances": 1}, {"lower": 1.5, "add_instances": 2}])
    assert "bands[0].upper (1.0) must equal bands[1].lower (1.5)" in error_for(data)


def test_the_traffic_profile_has_one_value_per_hour() -> None:
    data = set_path(base(), "llm.scaling.traffic.hourly_invocations_per_min", [5.0] * 23)
    assert "llm.scaling.traffic.hourly_invocations_per_min" in error_for(data)
    data = set_path(base(), "llm.scaling.traffic.hourly_invocations_per_min",
                    [5.0] * 12 + [-1.0] + [5.0] * 11)
    assert "hour 12:00 is -1.0; accepted: a number >= 0" in error_for(data)


def test_the_capacity_model_refuses_an_slo_no_batch_meets() -> None:
    data = set_path(base(), "llm.alarms.time_per_output_token_p99_ms", 5)
    message = error_for(data)
    assert "the capacity model refuses this configuration" in message
    assert "even one request misses the latency SLOs" in message
    assert "SLO 5" in message


def test_a_mix_request_outside_its_bucket_is_refused() -> None:
    data = set_path(base(), "llm.capacity.request_mix.S",
                    {"share": 0.10, "prompt_tokens": 600, "max_tokens": 256,
                     "output_tokens": 90})
    message = error_for(data)
    assert "S: prompt_tokens + max_tokens = 856 is bucket M, not S; accepted: S ≤ 512 tokens" \
        in message


def test_a_gpu_without_a_decode_profile_is_refused_with_the_fix() -> None:
    data = set_path(base(), "llm.instance_type", "ml.g6.xlarge")
    message = error_for(data)
    assert "no decode profile for NVIDIA L4 / llama-3-8b-instruct" in message
    assert "tools/gpu_smoke.sh" in message


def test_the_intent_endpoint_cannot_track_a_concurrency_it_has_no_figure_for() -> None:
    data = set_path(base(), "intent.scaling.target_metric", "concurrent_requests_per_model")
    assert "needs a concurrency per instance, which only the LLM's capacity model derives" in \
        error_for(data)


def test_duplicate_adapter_and_too_many_lora_slots() -> None:
    adapters = base()["llm"]["adapters"]
    data = set_path(base(), "llm.adapters", [*adapters, adapters[0]])
    assert "llm: adapters: name 'manga' is used twice" in error_for(data)
    assert "max_loras: 9 is more than the 3 configured adapters" in error_for(
        set_path(base(), "llm.max_loras", 9))


def test_lora_rank_must_be_one_vllm_accepts() -> None:
    adapters = base()["llm"]["adapters"]
    adapters[0] = {**adapters[0], "rank": 48}
    message = error_for(set_path(base(), "llm.adapters", adapters))
    assert "llm.adapters[0].rank: 48 is not accepted: must be one of 1, 8, 16, 32, 64" in message


def test_a_model_that_cannot_fit_is_refused_with_the_budget_numbers() -> None:
    data = set_path(set_path(base(), "llm.model.config", "config/models/llama-3-70b-instruct.json"),
                    "llm.model.quantization", "bf16")
    message = error_for(data)
    assert message.startswith("config/dev.yaml: llm: the GPU memory budget refuses this "
                              "configuration: ")
    assert "GiB" in message and "ml.g5.xlarge" in message
    assert "quantiz" in message.lower()  # the budget names the fixes


def test_max_model_len_with_no_room_for_one_sequence_is_refused() -> None:
    message = error_for(set_path(base(), "llm.max_model_len", 131072))
    assert "llm: the GPU memory budget refuses this configuration" in message
    assert "max_model_len" in message


def test_overrides_are_checked_by_the_budget_too() -> None:
    message = error_for(set_path(base(), "llm.engine.max_num_seqs", 4096))
    assert "llm: the GPU memory budget refuses this configuration" in message
    assert "max_num_seqs" in message


def test_artifact_bucket_name_is_stable_per_environment() -> None:
    assert load_settings("prod").artifact_bucket_name == (
        "manga-assist-prod-models-123456789012-ap-northeast-1")
    assert len(load_settings("prod").artifact_bucket_name) <= 63
