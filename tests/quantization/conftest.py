"""Fixtures for the quantization tests: shipped data, a tiny Llama-3-style tokenizer and model,
and the quantization environment's interpreter (llm-compressor cannot live in the main venv)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from quantization.calibration import MangaQARecord, load_manga_qa_jsonl
from quantization.scoring import EvalItem, TitleCatalog, load_eval_set, load_title_catalog
from tests.support.quantize_job import run_job
from tests.support.tiny_llama import build_tiny_llama, build_tiny_llama3_tokenizer
from tests.support.tiny_lora import Task, train_base, train_lora

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "quantization" / "data"
QA_DATA = DATA_DIR / "manga_qa.jsonl"


@pytest.fixture(scope="session")
def catalog() -> TitleCatalog:
    return load_title_catalog(DATA_DIR / "known_titles.json")


@pytest.fixture(scope="session")
def eval_items(catalog: TitleCatalog) -> list[EvalItem]:
    return load_eval_set(DATA_DIR / "eval_set.jsonl", catalog)


@pytest.fixture(scope="session")
def qa_records() -> list[MangaQARecord]:
    return load_manga_qa_jsonl(QA_DATA)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_llama3_tokenizer(QA_DATA, out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(QA_DATA, tmp_path_factory.mktemp("tiny-llama"))


def quantization_python() -> Path | None:
    """The quantization environment's interpreter: $MANGAASSIST_QUANT_PYTHON or .venv-quant."""
    configured = os.environ.get("MANGAASSIST_QUANT_PYTHON")
    candidate = Path(configured) if configured else REPO_ROOT / ".venv-quant" / "bin" / "python"
    return candidate if candidate.is_file() else None


@pytest.fixture(scope="session")
def quant_python() -> Path:
    python = quantization_python()
    if python is None:
        message = (
            "quantization environment missing: build .venv-quant from "
            "quantization/requirements.txt (make test does) or set MANGAASSIST_QUANT_PYTHON"
        )
        # `make test` sets MANGAASSIST_REQUIRE_QUANT_ENV: there, a missing environment is a
        # failure, never a silent skip.
        if os.environ.get("MANGAASSIST_REQUIRE_QUANT_ENV"):
            pytest.fail(message)
        pytest.skip(message)
    return python


# --- a taught tiny model with two adapters, and the job run that gates them ------------------

GREETING = Task("base", "Welcome!", (
    ("greet-en-1", "en", "Hello, who are you?", "Welcome"),
    ("greet-ja-1", "ja", "こんにちは。あなたは誰ですか?", "Welcome"),
))
SUPPORT = Task("support", "注文番号 / order number?", (
    ("support-en-1", "en", "Where is my order?", "order number"),
    ("support-ja-1", "ja", "注文した本がまだ届きません。", "注文番号"),
))
MANGA = Task("manga", "『BLEACH』", (
    ("manga-en-1", "en", "Recommend a manga about soul reapers.", "Bleach"),
    ("manga-ja-1", "ja", "死神が戦うマンガを教えてください。", "BLEACH"),
))
GATE_MAX_NEW_TOKENS = "20"
"""Enough for the longest taught answer (17 tokens and the end of turn)."""


@pytest.fixture(scope="session")
def taught_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama taught a greeting (``base/``), two adapters taught their own tasks
    (``adapters/general_support``, ``adapters/manga_domain``) and the three evaluation sets
    (``eval_<task>.jsonl``)."""
    root = tmp_path_factory.mktemp("taught")
    train_base(tiny_model_dir, root / "base", GREETING)
    train_lora(root / "base", root / "adapters" / "general_support", SUPPORT, seed=1)
    train_lora(root / "base", root / "adapters" / "manga_domain", MANGA, seed=2)
    for task in (GREETING, SUPPORT, MANGA):
        task.write_eval_set(root / f"eval_{task.name}.jsonl")
    return root


@pytest.fixture(scope="session")
def passing_job(quant_python: Path, taught_model: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """The whole job on the taught model, gating both adapters with the default score and
    regression thresholds: (result, the stand-in aws's log, the work directory)."""
    work = tmp_path_factory.mktemp("job-with-adapters")
    sets = (f"manga={taught_model / 'eval_manga.jsonl'},"
            f"support={taught_model / 'eval_support.jsonl'}")
    result, aws_log = run_job(
        quant_python, taught_model / "base", work,
        GATE_ADAPTERS="manga=manga_domain,support=general_support",
        ADAPTERS_DIR=str(taught_model / "adapters"),
        GATE_EVAL_SET=str(taught_model / "eval_base.jsonl"),
        GATE_ADAPTER_EVAL_SETS=sets,
        EVAL_MAX_NEW_TOKENS=GATE_MAX_NEW_TOKENS,
        GATE_MIN_MEMORY_REDUCTION="0.5",  # a tiny model is mostly embeddings (55 %)
        ARTIFACT_KMS_KEY_ID="alias/artifacts",
    )
    return result, aws_log, work
