"""The LLM serving image: Dockerfile lint, SageMaker contract, build context, versions.

No Docker engine here, so the image is not built; what can be checked without one is.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from stacks.llm_endpoint import LLM_IMAGE_SOURCES
from tests.support import images

REPO_ROOT = Path(__file__).resolve().parents[3]
LLM = REPO_ROOT / "containers" / "llm"
DOCKERFILE = (LLM / "Dockerfile").read_text()


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(LLM / "Dockerfile")], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sagemaker_contract() -> None:
    assert re.search(r"^FROM vllm/vllm-openai:v0\.33\.0$", DOCKERFILE, re.MULTILINE)
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true" in DOCKERFILE
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", DOCKERFILE, re.MULTILINE)
    assert entrypoint is not None
    assert entrypoint.group(1).startswith("["), "exec form, so SIGTERM reaches the gateway"
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in DOCKERFILE
    assert "GATEWAY_" not in DOCKERFILE.replace("(GATEWAY_*)", ""), (
        "the image names no gateway setting: serving_contract/environment.py holds the names and "
        "defaults (vllm, /opt/ml/model) and the stack writes the rest")
    assert not re.search(r"(?i)(secret|password|token)\s*=", DOCKERFILE), "non-secret defaults only"


def test_serve_accepts_sagemakers_serve_argument() -> None:
    from gateway.main import parse_arguments

    assert parse_arguments(["serve", "--port", "9000"]).port == 9000
    assert parse_arguments(["--port", "9000"]).port == 9000
    result = subprocess.run([sys.executable, str(LLM / "serve"), "serve", "--help"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "--engine" in result.stdout


def copied_paths() -> set[str]:
    return set(images.copy_sources(LLM / "Dockerfile"))


def first_party_imports(folder: Path) -> set[str]:
    """Top-level or dotted first-party modules the gateway imports."""
    first_party = {"gpu_budget", "metrics_contract", "request_buckets", "context_window", "intents", "prompts",
                   "quantization", "artifact_manifest", "serving_contract"}
    found: set[str] = set()
    for path in [*folder.rglob("*.py"), LLM / "serve"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in first_party:
                    found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] in first_party)
    return found


def test_every_first_party_module_the_gateway_imports_is_copied() -> None:
    copied = copied_paths()
    for module in first_party_imports(LLM / "gateway"):
        path = module.replace(".", "/")
        assert path in copied or f"{path}.py" in copied or path.split("/")[0] in copied, module


def test_cdk_and_docker_build_contexts_match() -> None:
    ignore = (LLM / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].strip().rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == set(LLM_IMAGE_SOURCES)
    for path in copied_paths():
        assert any(path == s or path.startswith(f"{s}/") for s in allowed), path


def pins(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.split("[")[0].lower()] = version.strip()
    return out


@pytest.fixture(scope="module")
def vllm_requirements(vllm_wheel: Path) -> dict[str, Requirement]:
    with zipfile.ZipFile(vllm_wheel) as wheel:
        metadata = wheel.read("vllm-0.33.0.dist-info/METADATA").decode()
    requirements = [Requirement(line.split(":", 1)[1].strip())
                    for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    return {r.name.lower(): r for r in requirements if r.marker is None}


def test_the_tests_run_the_versions_the_image_allows(
    vllm_requirements: dict[str, Requirement],
) -> None:
    tested = pins(REPO_ROOT / "requirements.txt")
    image = {Requirement(line).name.lower(): Requirement(line)
             for line in (LLM / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    for name in ("fastapi", "uvicorn", "pydantic", "tokenizers", "jinja2", "httpx"):
        version = tested[name]
        assert image[name].specifier.contains(version), f"{name} {version} vs image {image[name]}"
        if name in vllm_requirements:
            assert vllm_requirements[name].specifier.contains(version), (
                f"the suite tests {name} {version}; vLLM 0.33.0 requires {vllm_requirements[name]}")
