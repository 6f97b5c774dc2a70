"""neuron/compile.py end to end on cpu, its failures, and the inf1 code path with a stand-in SDK."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from artifact_manifest import artifact_files_from_json, check_model_dir
from intents import INTENT_LABELS
from neuron import compile as compile_cli
from neuron.manifest import manifest_from_json
from neuron.model_archive import list_model_tar, safe_extract, sha256_file
from neuron.targets import INF1_IMAGE, INF2_IMAGE


def test_cli_compiles_checks_parity_and_packages(cpu_artifact: Any) -> None:
    manifest = manifest_from_json((cpu_artifact.artifact_dir / "manifest.json").read_text())
    assert manifest.target.value == "cpu"
    assert manifest.labels == INTENT_LABELS
    assert manifest.batch_sizes == (1, 4)
    assert manifest.max_seq_length == 128
    assert manifest.model_files == {1: "model-b1.pt", 4: "model-b4.pt"}
    assert manifest.compiler == "torch.jit.trace"
    assert manifest.versions["torch"].startswith("2.13.0")
    assert manifest.versions["transformers"] == "5.23.0"
    # Parity: traced TorchScript, saved and reloaded, against the eager model on every sample.
    assert manifest.parity is not None
    assert manifest.parity.passed
    assert manifest.parity.samples == 19
    assert manifest.parity.max_abs_logit_diff <= 1e-4
    assert manifest.parity.top1_disagreements == 0
    assert sorted(manifest.latency) == [1, 4]
    for stats in manifest.latency.values():
        assert stats.iterations == 8
        assert 0 < stats.min_ms <= stats.p50_ms <= stats.p99_ms <= stats.max_ms
    # Every file but the two manifests is listed with its digest, and the digests are right.
    files = sorted(p.name for p in cpu_artifact.artifact_dir.iterdir())
    assert sorted(manifest.files_sha256) == [
        f for f in files if f not in ("manifest.json", "artifact-manifest.json")]
    for name, digest in manifest.files_sha256.items():
        assert sha256_file(cpu_artifact.artifact_dir / name) == digest
    # artifact-manifest.json: size and SHA-256 of every other file, manifest.json included,
    # so the serving container can check the unpacked archive before it starts.
    packed = artifact_files_from_json(
        (cpu_artifact.artifact_dir / "artifact-manifest.json").read_text())
    assert sorted(packed.files) == [f for f in files if f != "artifact-manifest.json"]
    assert check_model_dir(cpu_artifact.artifact_dir).files == len(files) - 1
    assert json.loads((cpu_artifact.artifact_dir / "labels.json").read_text()) == list(
        INTENT_LABELS)


def test_model_tar_has_sagemaker_layout(cpu_artifact: Any, tmp_path: Path) -> None:
    names = list_model_tar(cpu_artifact.tar_path)
    assert names == sorted(p.name for p in cpu_artifact.artifact_dir.iterdir())
    assert all("/" not in name for name in names), "files must sit at the archive root"
    assert {"manifest.json", "labels.json", "tokenizer.json", "model-b1.pt"} <= set(names)
    extracted = safe_extract(cpu_artifact.tar_path, tmp_path / "opt-ml-model")
    for path in extracted:
        assert path.read_bytes() == (cpu_artifact.artifact_dir / path.name).read_bytes()


def test_progress_is_shown_step_by_step(cpu_artifact: Any) -> None:
    lines = [line for line in cpu_artifact.stderr.splitlines() if line.startswith("[compile")]
    steps = [line.split("] ", 1)[1].split(" ", 1)[0] for line in lines if "] [" in line]
    assert steps == ["[1/7]", "[2/7]", "[3/7]", "[4/7]", "[5/7]", "[6/7]", "[7/7]"]
    assert "parity (saved and reloaded model-b4.pt)" in cpu_artifact.stderr
    assert "latency batch 4: 8/8 calls" in cpu_artifact.stderr
    assert "p50 ms" in cpu_artifact.stderr
    assert "done: cpu artifact" in cpu_artifact.stderr


@pytest.mark.parametrize(("target", "image", "module"), [
    ("inf1", INF1_IMAGE, "torch_neuron"),
    ("inf2", INF2_IMAGE, "torch_neuronx"),
])
def test_neuron_target_without_sdk_fails_at_once_naming_the_image(
        target: str, image: str, module: str, tiny_model_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    started = time.perf_counter()
    code = compile_cli.main(["--target", target, "--model-dir", str(tiny_model_dir),
                             "--out", str(tmp_path / "out")])
    elapsed_s = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == compile_cli.EXIT_ENVIRONMENT
    assert image in err
    assert module in err
    assert "PyPI" in err
    assert "loading" not in err, "must fail before loading the model"
    assert elapsed_s < 2.0
    assert not (tmp_path / "out").exists()


def test_pypi_placeholder_package_gets_the_same_message(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # PyPI's torch-neuron is a placeholder whose import raises ImportError("WRONG PACKAGE ...").
    fake_site = tmp_path / "site"
    (fake_site / "torch_neuron").mkdir(parents=True)
    (fake_site / "torch_neuron" / "__init__.py").write_text(
        'raise ImportError("WRONG PACKAGE: install torch-neuron from the Neuron repository")\n')
    monkeypatch.syspath_prepend(str(fake_site))
    monkeypatch.delitem(sys.modules, "torch_neuron", raising=False)
    code = compile_cli.main(["--target", "inf1", "--model-dir", str(tiny_model_dir),
                             "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == compile_cli.EXIT_ENVIRONMENT
    assert "WRONG PACKAGE" in err
    assert INF1_IMAGE in err


@pytest.mark.parametrize(("extra", "message"), [
    (["--batch-sizes", "0,8"], "--batch-sizes"),
    (["--batch-sizes", "one"], "--batch-sizes"),
    (["--batch-sizes", "1,65"], "1..64"),
    (["--seq-length", "4"], "--seq-length"),
    (["--parity-bound", "0"], "--parity-bound"),
    (["--pipeline-cores", "2"], "only for inf1"),
    (["--compiler-arg=--O2"], "inf1/inf2 only"),
    (["--skip-device-checks"], "inf1/inf2 only"),
])
def test_bad_arguments_exit_2_with_the_field(extra: list[str], message: str,
                                             tiny_model_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = compile_cli.main(["--target", "cpu", "--model-dir", str(tiny_model_dir),
                             "--out", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert code == compile_cli.EXIT_USAGE
    assert message in err
    assert err.startswith("error: ")


def test_missing_model_dir_and_existing_output_are_refused(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = compile_cli.main(["--target", "cpu", "--model-dir", str(tmp_path / "nope"),
                             "--out", str(tmp_path / "out")])
    assert code == compile_cli.EXIT_USAGE
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "out" / "model").mkdir(parents=True)
    code = compile_cli.main(["--target", "cpu", "--model-dir", str(tiny_model_dir),
                             "--out", str(tmp_path / "out")])
    assert code == compile_cli.EXIT_USAGE
    assert "--overwrite" in capsys.readouterr().err


@pytest.fixture
def relabelled_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model with generic LABEL_i names in its head, as an unlabelled fine-tune has."""
    copy = tmp_path / "relabelled"
    shutil.copytree(tiny_model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(len(INTENT_LABELS))}
    config["label2id"] = {f"LABEL_{i}": i for i in range(len(INTENT_LABELS))}
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_head_labels_must_match_the_router(relabelled_model: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = compile_cli.main(["--target", "cpu", "--model-dir", str(relabelled_model),
                             "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == compile_cli.EXIT_USAGE
    assert "id2label" in err
    assert "--trust-label-order" in err


def test_parity_over_the_bound_fails_without_packaging(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    real_trace = compile_cli.trace_for_target

    def trace_a_perturbed_model(target: Any, module: Any, example: Any, **kwargs: Any) -> Any:
        import torch

        traced = real_trace(target, module, example, **kwargs)
        with torch.no_grad():  # what a miscompiled graph would do: shift one logit
            class Shifted(torch.nn.Module):
                def __init__(self, inner: Any) -> None:
                    super().__init__()
                    self.inner = inner

                def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                    out = self.inner(ids, mask)
                    return out + torch.nn.functional.one_hot(
                        torch.tensor(2), out.shape[1]).to(out.dtype) * 0.5
            return torch.jit.trace(Shifted(traced), example)

    monkeypatch.setattr(compile_cli, "trace_for_target", trace_a_perturbed_model)
    out = tmp_path / "out"
    code = compile_cli.main(["--target", "cpu", "--model-dir", str(tiny_model_dir),
                             "--out", str(out), "--batch-sizes", "2",
                             "--latency-iterations", "1", "--latency-warmup", "0"])
    err = capsys.readouterr().err
    assert code == compile_cli.EXIT_PARITY
    assert "parity failed" in err
    assert "OVER bound" in err
    assert not (out / "model.tar.gz").exists()
    manifest = manifest_from_json((out / "model" / "manifest.json").read_text())
    assert manifest.parity is not None
    assert not manifest.parity.passed
    assert manifest.parity.max_abs_logit_diff == pytest.approx(0.5, abs=1e-4)
    assert manifest.servable_problem is not None
    assert "parity failed" in manifest.servable_problem


STAND_IN_TORCH_NEURON = """
import torch

CALLS = []


def trace(model, example_inputs, compiler_args=None, **kwargs):
    CALLS.append({"shape": tuple(example_inputs[0].shape), "compiler_args": compiler_args,
                  "kwargs": sorted(kwargs)})
    return torch.jit.trace(model, example_inputs)
"""


@pytest.fixture
def stand_in_torch_neuron(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An importable ``torch_neuron`` that records trace() calls and traces with torch.jit."""
    site = tmp_path / "stand-in-site"
    (site / "torch_neuron").mkdir(parents=True)
    (site / "torch_neuron" / "__init__.py").write_text(STAND_IN_TORCH_NEURON)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "torch_neuron", raising=False)
    yield site
    sys.modules.pop("torch_neuron", None)


def test_inf1_path_calls_torch_neuron_trace_as_documented(
        relabelled_model: Path, tmp_path: Path, stand_in_torch_neuron: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stand-in for torch_neuron (not available here) records how compile.py calls it.

    It checks the call shape of the documented API -- ``torch_neuron.trace(model,
    example_inputs=..., compiler_args=[...])`` with NeuronCore Pipeline as
    ``--neuroncore-pipeline-cores N`` -- and the compile-only path (--skip-device-checks). It
    proves nothing about neuron-cc itself, which only runs in the Neuron image.
    """
    out = tmp_path / "out"
    code = compile_cli.main(["--target", "inf1", "--model-dir", str(relabelled_model),
                             "--out", str(out), "--batch-sizes", "1,2", "--pipeline-cores", "2",
                             "--compiler-arg=--fast-math=none", "--skip-device-checks",
                             "--trust-label-order"])
    err = capsys.readouterr().err
    assert code == compile_cli.EXIT_OK, err
    flags = ["--neuroncore-pipeline-cores", "2", "--fast-math=none"]
    assert [
        {"shape": (1, 128), "compiler_args": flags, "kwargs": []},
        {"shape": (2, 128), "compiler_args": flags, "kwargs": []},
    ] == sys.modules["torch_neuron"].CALLS
    manifest = manifest_from_json((out / "model" / "manifest.json").read_text())
    assert manifest.target.value == "inf1"
    assert manifest.pipeline_cores == 2
    assert manifest.parity is None
    assert manifest.latency == {}
    assert "--skip-device-checks" in manifest.notes[0]
    assert manifest.versions["torch-neuron"] == "not installed"
    assert "model-b2.pt" in list_model_tar(out / "model.tar.gz")


def test_inf1_without_a_neuron_device_stops_before_loading(
        tiny_model_dir: Path, tmp_path: Path, stand_in_torch_neuron: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    code = compile_cli.main(["--target", "inf1", "--model-dir", str(tiny_model_dir),
                             "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == compile_cli.EXIT_ENVIRONMENT
    assert "/dev/neuron0" in err
    assert "--skip-device-checks" in err
    assert INF1_IMAGE in err
    assert not (tmp_path / "out").exists()


def test_overwrite_replaces_a_previous_compile(tiny_model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "model" / "model-b8.pt").write_text("from an older compile")
    (out / "model.tar.gz").write_text("older archive")
    args = ["--target", "cpu", "--model-dir", str(tiny_model_dir), "--out", str(out),
            "--batch-sizes", "4", "--latency-iterations", "1", "--latency-warmup", "0"]
    assert compile_cli.main(args) == compile_cli.EXIT_USAGE
    assert compile_cli.main([*args, "--overwrite"]) == compile_cli.EXIT_OK
    capsys.readouterr()
    assert not (out / "model" / "model-b8.pt").exists()
    assert "model-b4.pt" in list_model_tar(out / "model.tar.gz")
    assert "model-b8.pt" not in list_model_tar(out / "model.tar.gz")
