"""One definition of request sizes: request_buckets owns the S/M/L/XL bounds, and the gateway,
the GPU budget, the metrics contract and the dashboard read it instead of defining their own."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import pytest

import metrics_contract as mc
from request_buckets import (
    BUCKET_NAMES,
    MIN_MAX_MODEL_LEN,
    REJECTION_BUCKETS,
    UNSIZED,
    BucketBounds,
    RequestBucket,
    bucket_bounds,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
READERS: tuple[str, ...] = (
    "containers/llm/gateway", "gpu_budget", "metrics_contract", "stacks/dashboard.py")
"""Where request sizes are used; none may define its own bounds."""


# --- the definition ----------------------------------------------------------------------------
def test_seed_001s_window_gives_512_1024_2048() -> None:
    bounds = bucket_bounds(4096)
    assert (bounds.s_max, bounds.m_max, bounds.l_max, bounds.upper("XL")) == (512, 1024, 2048,
                                                                               4096)
    assert BUCKET_NAMES == ("S", "M", "L", "XL")


@pytest.mark.parametrize(("tokens", "bucket"), [
    (1, "S"), (512, "S"), (513, "M"), (1024, "M"), (1025, "L"), (2048, "L"), (2049, "XL"),
    (4096, "XL"), (10**6, "XL")])
def test_classify_at_the_bounds(tokens: int, bucket: str) -> None:
    assert bucket_bounds(4096).classify(tokens) is RequestBucket(bucket)


@pytest.mark.parametrize("window", [MIN_MAX_MODEL_LEN, 9, 1000, 2048, 3072, 4096, 8192, 131072])
def test_every_bucket_is_reachable_and_xl_is_over_half_the_window(window: int) -> None:
    bounds = bucket_bounds(window)
    assert 1 <= bounds.s_max < bounds.m_max < bounds.l_max < window
    assert bounds.l_max == window // 2
    assert bounds.classify(bounds.l_max + 1) is RequestBucket.XL
    assert bounds.classify(window) is RequestBucket.XL
    assert [bounds.lower_exclusive(name) for name in BUCKET_NAMES] == [
        0, bounds.s_max, bounds.m_max, bounds.l_max]


def test_labels_name_the_token_ranges() -> None:
    bounds = bucket_bounds(4096)
    assert [bounds.label(name) for name in BUCKET_NAMES] == [
        "S ≤ 512", "M 513–1,024", "L 1,025–2,048", "XL 2,049–4,096"]


@pytest.mark.parametrize("window", [0, 7, -4096, True, 4096.0, "4096"])
def test_a_window_that_cannot_be_split_is_refused_by_name(window: object) -> None:
    with pytest.raises(ValueError, match=r"max_model_len .* is not accepted; accepted: an integer"):
        bucket_bounds(window)  # type: ignore[arg-type]


def test_hand_made_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="accepted: 1 <= S < M < L < max_model_len"):
        BucketBounds(max_model_len=4096, s_max=1024, m_max=512, l_max=2048)


def test_bucket_values_format_as_their_names() -> None:
    assert f"{RequestBucket.XL}" == str(RequestBucket.XL) == "XL"  # metrics and logs carry these


def test_module_runs_on_python_3_10() -> None:
    # The Inf1 serving image (Python 3.10) copies metrics_contract, which imports this module.
    source = (REPO_ROOT / "request_buckets" / "__init__.py").read_text(encoding="utf-8")
    ast.parse(source, feature_version=(3, 10))
    assert "StrEnum" not in source.replace("rather than StrEnum", "").replace("no StrEnum", "")


# --- everyone reads it ---------------------------------------------------------------------
def test_the_gateway_admits_by_these_buckets() -> None:
    from gateway.admission import LengthBucket, classify_bucket
    from gateway.api.protocol import ResponseExtension
    from gateway.settings import load_settings

    assert LengthBucket is RequestBucket
    settings = load_settings({"ENGINE_MAX_MODEL_LEN": "4096"})
    assert settings.gateway.buckets.bounds == bucket_bounds(4096)
    assert set(settings.gateway.buckets.caps) == set(BUCKET_NAMES)
    assert classify_bucket(1025, settings.gateway.buckets.bounds) is RequestBucket.L
    assert get_args(ResponseExtension.model_fields["bucket"].annotation) == BUCKET_NAMES


def test_the_gpu_budget_sizes_these_buckets() -> None:
    from gpu_budget import plan
    from stacks.settings import load_settings

    llm = load_settings("prod").llm
    memory_plan = llm.memory_plan()
    bounds = bucket_bounds(memory_plan.max_model_len)
    assert [(b.bucket, b.sized_tokens) for b in memory_plan.buckets] == [
        (name, bounds.upper(name)) for name in BUCKET_NAMES]
    other = plan(str(REPO_ROOT / llm.model.config), quantization="awq",
                 instance="ml.g5.xlarge", max_model_len=8192)
    assert [b.sized_tokens for b in other.buckets] == [1024, 2048, 4096, 8192]


def test_the_metrics_contract_accepts_exactly_these_bucket_values() -> None:
    assert mc.ADMISSION_REJECTIONS.values_of("Bucket") == (*BUCKET_NAMES, UNSIZED)
    assert REJECTION_BUCKETS == ("S", "M", "L", "XL", "Unsized")
    dims = {"EndpointName": "e", "VariantName": "v"}
    for name in REJECTION_BUCKETS:
        mc.emf_document({mc.ADMISSION_REJECTIONS: 1}, {**dims, "Bucket": name}, timestamp_ms=0)
    with pytest.raises(ValueError,
                       match=r"Bucket='XXL' is not accepted; accepted: S, M, L, XL, Unsized"):
        mc.emf_document({mc.ADMISSION_REJECTIONS: 1}, {**dims, "Bucket": "XXL"}, timestamp_ms=0)


def test_the_dashboard_draws_one_line_per_contract_bucket() -> None:
    from stacks import dashboard

    assert dashboard.BUCKET_NAMES == REJECTION_BUCKETS
    assert bucket_bounds(4096).label(UNSIZED) == "unsized (refused unparsed)"


# --- and nobody defines their own ------------------------------------------------------------
BOUND_LIKE_NAME = re.compile(r"bound", re.IGNORECASE)
BOUNDS_TEXT = re.compile(r"\bS\s*=\s*\d+\s*,\s*M\s*=\s*\d+\s*,\s*L\s*=\s*\d+(?!\d)(?!\s*,\s*XL)")
"""Bounds as text: S, M and L only (XL is unbounded); per-bucket caps name XL too."""


def own_definitions(source: str, where: str) -> list[str]:
    """Bucket bounds written into ``source``: literal numbers bound to a name or keyword about
    bounds, a "S=512,M=1024"-style default, or a bucket built from a name and a number."""
    found: list[str] = []

    def has_number(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Constant) and type(n.value) is int and n.value > 1
                   for n in ast.walk(node))

    for node in ast.walk(ast.parse(source)):
        targets: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.Assign):
            targets = [(ast.unparse(t), node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [(ast.unparse(node.target), node.value)]
        elif isinstance(node, ast.keyword) and node.arg:
            targets = [(node.arg, node.value)]
        for name, value in targets:
            if BOUND_LIKE_NAME.search(name) and has_number(value) \
                    and "bucket_bounds(" not in ast.unparse(value):
                found.append(f"{where}:{node.lineno}: {name} = {ast.unparse(value)[:80]}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and BOUNDS_TEXT.search(node.value):
            found.append(f"{where}:{node.lineno}: {node.value[:80]!r}")
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in BUCKET_NAMES and has_number(ast.Tuple(
                    elts=node.args[1:], ctx=ast.Load())):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def reader_sources() -> list[Path]:
    paths: list[Path] = []
    for reader in READERS:
        path = REPO_ROOT / reader
        paths.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return paths


def test_no_reader_defines_its_own_bounds() -> None:
    found = [hit for path in reader_sources()
             for hit in own_definitions(path.read_text(encoding="utf-8"),
                                        str(path.relative_to(REPO_ROOT)))]
    assert found == []


@pytest.mark.parametrize("definition", [
    # what the GPU budget had (gpu_budget/lengths.py) and the gateway's default and fallback
    'REQUEST_BUCKETS = (LengthBucket("S", 512), LengthBucket("M", 2048))',
    'SPEC = SettingSpec("GATEWAY_BUCKET_BOUNDS", "S=512,M=1024,L=2048", "help")',
    'policy = BucketPolicy(bounds={"S": 512, "M": 1024, "L": 2048, **bounds}, caps=caps)',
    'BOUNDS = {"S": 512, "M": 1024, "L": 2048}',
])
def test_the_check_catches_the_definitions_it_replaced(definition: str) -> None:
    assert own_definitions(definition, "example.py"), definition


def test_the_check_leaves_reading_the_module_and_the_caps_alone() -> None:
    assert own_definitions(
        'policy = BucketPolicy(bounds=bucket_bounds(max_model_len), '
        'caps={"S": 128, "M": 64, "L": 32, "XL": 8})\n'
        'SPEC = SettingSpec("GATEWAY_BUCKET_CAPS", "S=128,M=64,L=32,XL=8", "help")',
        "example.py") == []
