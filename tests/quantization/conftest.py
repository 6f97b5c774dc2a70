"""Fixtures for the quantization tests: shipped data, a tiny Llama-3-style tokenizer and model,
and the quantization environment's interpreter (llm-compressor cannot live in the main venv)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantization.calibration import MangaQARecord, load_manga_qa_jsonl
from quantization.scoring import EvalItem, TitleCatalog, load_eval_set, load_title_catalog
from tests.support.tiny_llama import build_tiny_llama, build_tiny_llama3_tokenizer

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
