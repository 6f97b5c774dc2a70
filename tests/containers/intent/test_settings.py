"""intent_server.settings: the SageMaker defaults, the environment it reads, and errors that
name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from intent_server.settings import SettingsError, load_settings
from neuron.targets import CompileTarget


def test_defaults_follow_the_sagemaker_contract() -> None:
    settings = load_settings({})
    assert settings.model_dir == Path("/opt/ml/model")
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)
    assert settings.image_target is None
    assert settings.model_copies is None
    assert (settings.metrics_endpoint_name, settings.metrics_variant_name) == ("local", "local")


def test_settings_are_read_from_the_environment() -> None:
    settings = load_settings({"SAGEMAKER_BIND_TO_PORT": "9090", "INTENT_TARGET": "inf1",
                              "INTENT_MODEL_COPIES": "2", "INTENT_VERIFY_CHECKSUMS": "no",
                              "INTENT_METRICS_ENDPOINT_NAME": "intent-prod",
                              "INTENT_METRICS_VARIANT_NAME": "AllTraffic",
                              "INTENT_REPLICA_WAIT_S": "2.5"})
    assert settings.port == 9090
    assert settings.image_target is CompileTarget.INF1
    assert settings.model_copies == 2
    assert settings.verify_checksums is False
    assert settings.metrics_endpoint_name == "intent-prod"
    assert settings.replica_wait_s == 2.5


@pytest.mark.parametrize(("env", "message"), [
    ({"SAGEMAKER_BIND_TO_PORT": "eighty"}, "SAGEMAKER_BIND_TO_PORT='eighty' is not an integer"),
    ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "accepted: 1..65535"),
    ({"INTENT_TARGET": "gpu"}, "INTENT_TARGET: unknown target 'gpu'"),
    ({"INTENT_MODEL_COPIES": "0"}, "INTENT_MODEL_COPIES=0"),
    ({"INTENT_VERIFY_CHECKSUMS": "maybe"}, "not a boolean"),
    ({"INTENT_REPLICA_WAIT_S": "120"}, "INTENT_REPLICA_WAIT_S=120.0 is out of range"),
    ({"INTENT_METRICS_ENDPOINT_NAME": "bad\nname"}, "INTENT_METRICS_ENDPOINT_NAME"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_settings(env)
