"""Fixtures for the GPU budget tests: the shipped model configs and a test GPU factory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_budget import InstanceType, ModelSpec, load_model_spec

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / "config" / "models"
LLAMA_3_8B = MODELS_DIR / "llama-3-8b-instruct.json"
LLAMA_3_70B = MODELS_DIR / "llama-3-70b-instruct.json"
LLAMA_32_1B = MODELS_DIR / "llama-3.2-1b-instruct.json"



@pytest.fixture(scope="session")
def llama8b() -> ModelSpec:
    return load_model_spec(LLAMA_3_8B)


@pytest.fixture(scope="session")
def llama70b() -> ModelSpec:
    return load_model_spec(LLAMA_3_70B)


@pytest.fixture(scope="session")
def llama1b() -> ModelSpec:
    return load_model_spec(LLAMA_32_1B)


def _make_gpu(memory_bytes: int, *, count: int = 1, capability: tuple[int, int] = (8, 6),
              name: str = "test.gpu") -> InstanceType:
    """An instance type outside the catalog, for properties over GPU memory."""
    return InstanceType(
        name=name,
        accelerator_kind="gpu",
        accelerator_model="Test GPU",
        accelerator_count=count,
        memory_per_accelerator_bytes=memory_bytes,
        compute_capability=capability,
        neuron_cores=None,
        reference_usd_per_hour_us_east_1=1.0,
        price_basis="test",
    )


@pytest.fixture(scope="session")
def make_gpu() -> Callable[..., InstanceType]:
    """Factory for instance types outside the catalog (memory, count, compute capability)."""
    return _make_gpu
