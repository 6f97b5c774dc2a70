"""Start-up checks of the model directory that no retry can fix: they fail the start at once.

An engine that cannot find its weights or is asked for a context longer than the model's
positions fails the same way on every attempt; retrying it five times only hides the reason
behind "engine starting" for minutes. These checks read ``config.json`` and list the weight files
(nothing is loaded) and raise :class:`~gateway.engines.base.EngineConfigError` naming the setting,
its value and what is accepted, so ``serve`` exits 2 with one line. Pure module apart from
reading the directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.engines.base import EngineConfigError
from gpu_budget.engine_args import ENGINE_ARG
from serving_contract.environment import GATEWAY_MODEL_DIR

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
SAFETENSORS_INDEX = "model.safetensors.index.json"
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                 "max_sequence_length", "max_seq_length")
"""Where Hugging Face configs state the longest sequence the model has positions for."""


def read_model_config(model_dir: Path) -> dict[str, Any]:
    """``config.json`` of ``model_dir``; EngineConfigError naming GATEWAY_MODEL_DIR if unusable."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise EngineConfigError(
            f"{GATEWAY_MODEL_DIR}={str(model_dir)!r}: no config.json there; expected a Hugging "
            "Face model directory (config.json, tokenizer files, *.safetensors)",
            setting=GATEWAY_MODEL_DIR)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise EngineConfigError(f"{GATEWAY_MODEL_DIR}={str(model_dir)!r}: config.json is not "
                                f"readable JSON ({error})", setting=GATEWAY_MODEL_DIR) from None
    if not isinstance(config, dict):
        raise EngineConfigError(f"{GATEWAY_MODEL_DIR}={str(model_dir)!r}: config.json must hold a "
                                "JSON object", setting=GATEWAY_MODEL_DIR)
    return config


def check_weights(model_dir: Path) -> None:
    """The weight files exist: every shard a safetensors index names, else at least one file."""
    index = model_dir / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, ValueError, AttributeError) as error:
            raise EngineConfigError(f"{GATEWAY_MODEL_DIR}={str(model_dir)!r}: {SAFETENSORS_INDEX} "
                                    f"is not a usable index ({error})",
                                    setting=GATEWAY_MODEL_DIR) from None
        missing = sorted({name for name in weight_map.values()
                          if not (model_dir / str(name)).is_file()})
        if missing:
            raise EngineConfigError(
                f"{GATEWAY_MODEL_DIR}={str(model_dir)!r}: {len(missing)} weight shard(s) named in "
                f"{SAFETENSORS_INDEX} are missing: {', '.join(missing[:3])}"
                f"{' ...' if len(missing) > 3 else ''}", setting=GATEWAY_MODEL_DIR)
        return
    if not any(any(model_dir.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise EngineConfigError(
            f"{GATEWAY_MODEL_DIR}={str(model_dir)!r}: no weight files there; expected "
            f"{' or '.join(WEIGHT_PATTERNS)} (an uncompressed S3 prefix must hold the model's "
            "files at its root)", setting=GATEWAY_MODEL_DIR)


def model_positions(config: Mapping[str, Any]) -> int | None:
    """The longest sequence the model has positions for, or None when the config extends it
    (rope scaling with a factor: vLLM derives the length itself and its own check applies)."""
    for key in ("rope_scaling", "rope_parameters"):
        scaling = config.get(key)
        if isinstance(scaling, Mapping) and scaling.get("factor") not in (None, 1, 1.0):
            return None
    found = [value for key in POSITION_KEYS
             if isinstance(value := config.get(key), int) and not isinstance(value, bool)
             and value > 0]
    return min(found) if found else None


def check_model_dir(model_dir: Path, *, max_model_len: int) -> dict[str, Any]:
    """Every start-up check of this module; returns the parsed ``config.json``."""
    config = read_model_config(model_dir)
    check_weights(model_dir)
    positions = model_positions(config)
    if positions is not None and max_model_len > positions:
        setting = ENGINE_ARG["max_model_len"].env
        raise EngineConfigError(
            f"{setting}={max_model_len}: above the model's position limit of "
            f"{positions} tokens (config.json in {model_dir}); accepted: at most {positions}",
            setting=setting)
    return config
