"""Server settings from the environment, validated, with errors that name the variable.

SageMaker passes configuration as environment variables; the stack sets the INTENT_* ones.

| variable                       | default          | meaning                                      |
|--------------------------------|------------------|----------------------------------------------|
| INTENT_MODEL_DIR               | /opt/ml/model    | the unpacked model.tar.gz                    |
| SAGEMAKER_BIND_TO_PORT         | 8080             | port (SageMaker's bind-to-port contract)     |
| INTENT_HOST                    | 0.0.0.0          | interface to listen on                       |
| INTENT_TARGET                  | (unset)          | image's target; must match the artifact's    |
| INTENT_MODEL_COPIES            | (all cores)      | model copies (≤ NeuronCores ÷ pipeline cores)|
| INTENT_MAX_BATCH_TEXTS         | 64               | texts per request                            |
| INTENT_MAX_TEXT_CHARS          | 10000            | characters per text                          |
| INTENT_MAX_BODY_BYTES          | 1048576          | request body                                 |
| INTENT_REPLICA_WAIT_S          | 20               | wait for a free model copy before 503        |
| INTENT_VERIFY_CHECKSUMS        | true             | check files against manifest.files_sha256    |
| INTENT_WARMUP_CALLS            | 5                | warmup calls per model copy and batch size   |
| INTENT_METRICS_ENDPOINT_NAME   | local            | EMF dimension EndpointName                   |
| INTENT_METRICS_VARIANT_NAME    | local            | EMF dimension VariantName                    |
| INTENT_METRICS                 | true             | emit EMF lines on stdout                     |

Pure module, Python 3.10-compatible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neuron.targets import CompileTarget, parse_target


class SettingsError(ValueError):
    """An environment variable has a value the server cannot use."""


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server reads from its environment."""

    model_dir: Path = Path("/opt/ml/model")
    host: str = "0.0.0.0"  # a container listens on every interface
    port: int = 8080
    image_target: CompileTarget | None = None
    model_copies: int | None = None
    max_batch_texts: int = 64
    max_text_chars: int = 10_000
    max_body_bytes: int = 1 << 20
    replica_wait_s: float = 20.0
    verify_checksums: bool = True
    warmup_calls: int = 5
    """TorchScript's profiling executor optimizes the graph over the first few calls."""
    metrics_enabled: bool = True
    metrics_endpoint_name: str = "local"
    metrics_variant_name: str = "local"


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer; accepted: {low}..{high}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value} is out of range; accepted: {low}..{high}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number; accepted: {low}..{high}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value} is out of range; accepted: {low}..{high}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean; accepted: true/false, 1/0, yes/no")


def _name(env: Mapping[str, str], name: str, default: str) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip()
    if len(value) > 255 or not value.isprintable():
        raise SettingsError(f"{name}={raw!r} is not a usable CloudWatch dimension value "
                            "(printable, at most 255 characters)")
    return value


def load_settings(env: Mapping[str, str]) -> ServerSettings:
    """Read and validate the settings; raise SettingsError naming the first bad variable."""
    target_raw = env.get("INTENT_TARGET", "").strip()
    try:
        image_target = parse_target(target_raw, field="INTENT_TARGET") if target_raw else None
    except ValueError as error:
        raise SettingsError(str(error)) from None
    copies_raw = env.get("INTENT_MODEL_COPIES", "").strip()
    model_copies = _int(env, "INTENT_MODEL_COPIES", 1, 1, 64) if copies_raw else None
    port = _int(env, "SAGEMAKER_BIND_TO_PORT", 8080, 1, 65535)
    model_dir = Path(env.get("INTENT_MODEL_DIR", "").strip() or "/opt/ml/model")
    return ServerSettings(
        model_dir=model_dir,
        host=env.get("INTENT_HOST", "").strip() or "0.0.0.0",
        port=port,
        image_target=image_target,
        model_copies=model_copies,
        max_batch_texts=_int(env, "INTENT_MAX_BATCH_TEXTS", 64, 1, 1024),
        max_text_chars=_int(env, "INTENT_MAX_TEXT_CHARS", 10_000, 16, 1_000_000),
        max_body_bytes=_int(env, "INTENT_MAX_BODY_BYTES", 1 << 20, 1024, 64 << 20),
        replica_wait_s=_float(env, "INTENT_REPLICA_WAIT_S", 20.0, 0.1, 55.0),
        verify_checksums=_bool(env, "INTENT_VERIFY_CHECKSUMS", True),
        warmup_calls=_int(env, "INTENT_WARMUP_CALLS", 5, 1, 100),
        metrics_enabled=_bool(env, "INTENT_METRICS", True),
        metrics_endpoint_name=_name(env, "INTENT_METRICS_ENDPOINT_NAME", "local"),
        metrics_variant_name=_name(env, "INTENT_METRICS_VARIANT_NAME", "local"),
    )
