"""manifest.json: round trip of a real compiled manifest, and every refusal names its field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from intents import INTENT_LABELS
from neuron.manifest import (
    ManifestError,
    check_labels,
    labels_from_json,
    manifest_from_dict,
    manifest_from_json,
    model_file_name,
)


@pytest.fixture
def manifest_dict(cpu_artifact: Any) -> dict[str, Any]:
    return json.loads((cpu_artifact.artifact_dir / "manifest.json").read_text())


def test_round_trip_is_lossless(manifest_dict: dict[str, Any]) -> None:
    manifest = manifest_from_dict(manifest_dict)
    assert json.loads(manifest.to_json()) == manifest_dict
    assert manifest_from_json(manifest.to_json()) == manifest
    assert manifest.servable_problem is None
    assert model_file_name(8) == "model-b8.pt"


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    node = changed
    keys = path.split("/")
    for key in keys[:-1]:
        node = node[key]
    if value is KeyError:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return changed


@pytest.mark.parametrize(("path", "value", "message"), [
    ("format_version", 2, "format_version"),
    ("target", "gpu", "unknown target 'gpu'"),
    ("labels", [], "manifest.labels"),
    ("labels", ["faq", "faq"], "duplicate"),
    ("max_seq_length", 0, "max_seq_length"),
    ("batch_sizes", [4, 1], "ascending"),
    ("batch_sizes", [], "batch_sizes"),
    ("batch_sizes", [1, True], "batch_sizes"),
    ("input_names", ["input_ids"], "input_names"),
    ("model_files/1", "../../etc/passwd", "plain file name"),
    ("model_files/1", KeyError, "model_files"),
    ("pad_token_id", -1, "pad_token_id"),
    ("pipeline_cores", 0, "pipeline_cores"),
    ("versions", {"torch": 2}, "versions"),
    ("parity/max_abs_logit_diff", "tiny", "parity.max_abs_logit_diff"),
    ("latency/1/p50_ms", None, "latency['1'].p50_ms"),
    ("latency/1", {"batch_size": 1}, "latency['1']"),
    ("files_sha256/model-b1.pt", "abc", "SHA-256"),
    ("files_sha256/model-b1.pt", KeyError, "no digest"),
    ("compiler", KeyError, "manifest.compiler: missing"),
])
def test_bad_fields_are_named(manifest_dict: dict[str, Any], path: str, value: Any,
                              message: str) -> None:
    with pytest.raises(ManifestError, match=message.replace("[", r"\[").replace("(", r"\(")):
        manifest_from_dict(_set(manifest_dict, path, value))


def test_latency_for_an_uncompiled_batch_size_is_refused(manifest_dict: dict[str, Any]) -> None:
    bad = copy.deepcopy(manifest_dict)
    bad["latency"]["16"] = dict(bad["latency"]["1"], batch_size=16)
    with pytest.raises(ManifestError, match=r"\[16\] were not compiled"):
        manifest_from_dict(bad)


def test_not_json_and_not_an_object() -> None:
    with pytest.raises(ManifestError, match="not valid JSON"):
        manifest_from_json("{")
    with pytest.raises(ManifestError, match="JSON object"):
        manifest_from_json("[]")


def test_failed_parity_makes_the_artifact_unservable(manifest_dict: dict[str, Any]) -> None:
    bad = _set(manifest_dict, "parity/max_abs_logit_diff", 1.0)
    problem = manifest_from_dict(bad).servable_problem
    assert problem is not None
    assert "parity failed" in problem


def test_labels_must_match_labels_json_and_the_router(manifest_dict: dict[str, Any]) -> None:
    manifest = manifest_from_dict(manifest_dict)
    check_labels(manifest, labels_from_json(json.dumps(list(INTENT_LABELS))), INTENT_LABELS)
    with pytest.raises(ManifestError, match=r"labels\.json"):
        check_labels(manifest, list(reversed(INTENT_LABELS)), INTENT_LABELS)
    with pytest.raises(ManifestError, match="router's intents"):
        check_labels(manifest, INTENT_LABELS, (*INTENT_LABELS, "new_intent"))
    for text in ("{", "[]", '[1, 2]', '{"a": 1}'):
        with pytest.raises(ManifestError, match=r"labels\.json"):
            labels_from_json(text)
