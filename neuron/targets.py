"""The three compile targets of the intent classifier, and what each one needs.

inf1 (NeuronCore v1) needs torch-neuron and neuron-cc: Neuron SDK 1.x-era packages that Neuron
2.27 dropped, so the last image that has them is the 2.20.2 one below. inf2 needs torch-neuronx
and neuronx-cc. Neither can be installed from PyPI (PyPI's packages of those names are
placeholders that raise ``ImportError("WRONG PACKAGE ...")``): compiling and serving for them
happens inside these images. cpu is plain ``torch.jit.trace`` for tests and local runs.

The image names here are also the defaults of ``containers/intent/Dockerfile``'s build arguments;
a test keeps the two in step.

Pure module, Python 3.10-compatible (the Inf1 image runs Python 3.10).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

INF1_IMAGE = (
    "public.ecr.aws/neuron/pytorch-inference-neuron:1.13.1-neuron-py310-sdk2.20.2-ubuntu20.04")
"""Last Neuron inference image with torch-neuron (PyTorch 1.13.1, Python 3.10) for inf1."""

INF2_IMAGE = (
    "public.ecr.aws/neuron/pytorch-inference-neuronx:2.8.0-neuronx-py311-sdk2.26.1-ubuntu22.04")
"""Neuron inference image with torch-neuronx (PyTorch 2.8, Python 3.11) for inf2."""

CPU_IMAGE = "python:3.11-slim-bookworm"
"""Plain Python base for local cpu runs (the Dockerfile installs the CPU build of torch)."""


class CompileTarget(str, Enum):  # noqa: UP042 - StrEnum is Python 3.11+, the Inf1 image has 3.10
    """Where the compiled classifier runs."""

    INF1 = "inf1"
    INF2 = "inf2"
    CPU = "cpu"


@dataclass(frozen=True)
class TargetProfile:
    """Everything the compiler and the server need to know about one target."""

    target: CompileTarget
    runtime_module: str | None
    """Module to import before ``torch.jit.load`` (registers the Neuron ops); None on cpu."""
    framework_distribution: str | None
    """pip distribution of that module, for the manifest's versions."""
    compiler_distribution: str | None
    """pip distribution of the compiler the framework drives (neuron-cc / neuronx-cc)."""
    compiler_name: str
    image: str
    """The image in which to compile for, and serve, this target."""
    compile_requirements: str
    """Extra pins for compile.py inside that image (transformers that fits its torch)."""
    neuron_cores_per_device: int
    """NeuronCores per /dev/neuronN device: 4 on Inferentia 1, 2 on Inferentia 2; 0 on cpu."""
    supports_pipeline_cores: bool
    """NeuronCore Pipeline (``--neuroncore-pipeline-cores``) exists only in neuron-cc (inf1)."""
    default_parity_bound: float
    """Default bound on max |Δlogit| against the eager fp32 model. Neuron compilers auto-cast
    matmuls to bf16/fp16, so their bound is looser than plain TorchScript's."""


PROFILES: dict[CompileTarget, TargetProfile] = {
    CompileTarget.INF1: TargetProfile(
        target=CompileTarget.INF1,
        runtime_module="torch_neuron",
        framework_distribution="torch-neuron",
        compiler_distribution="neuron-cc",
        compiler_name="neuron-cc (torch_neuron.trace)",
        image=INF1_IMAGE,
        compile_requirements="neuron/requirements-inf1.txt",
        neuron_cores_per_device=4,
        supports_pipeline_cores=True,
        default_parity_bound=0.05,
    ),
    CompileTarget.INF2: TargetProfile(
        target=CompileTarget.INF2,
        runtime_module="torch_neuronx",
        framework_distribution="torch-neuronx",
        compiler_distribution="neuronx-cc",
        compiler_name="neuronx-cc (torch_neuronx.trace)",
        image=INF2_IMAGE,
        compile_requirements="neuron/requirements-inf2.txt",
        neuron_cores_per_device=2,
        supports_pipeline_cores=False,
        default_parity_bound=0.05,
    ),
    CompileTarget.CPU: TargetProfile(
        target=CompileTarget.CPU,
        runtime_module=None,
        framework_distribution=None,
        compiler_distribution=None,
        compiler_name="torch.jit.trace",
        image=CPU_IMAGE,
        compile_requirements="requirements.txt",
        neuron_cores_per_device=0,
        supports_pipeline_cores=False,
        default_parity_bound=1e-4,
    ),
}


def parse_target(value: str, *, field: str = "target") -> CompileTarget:
    """Return the target named ``value``; raise ValueError naming the field and the choices."""
    try:
        return CompileTarget(value)
    except ValueError:
        accepted = ", ".join(t.value for t in CompileTarget)
        raise ValueError(f"{field}: unknown target {value!r}; accepted: {accepted}") from None


def profile(target: CompileTarget | str) -> TargetProfile:
    """The profile of ``target`` (a CompileTarget or its name)."""
    key = target if isinstance(target, CompileTarget) else parse_target(target)
    return PROFILES[key]


def sdk_missing_message(target: CompileTarget, detail: str) -> str:
    """The one message both the compiler and the server print when a Neuron SDK is absent."""
    prof = PROFILES[target]
    return (
        f"target {target.value} needs {prof.framework_distribution} ({prof.runtime_module}), "
        f"which is not usable here: {detail}. It cannot be installed from PyPI (the PyPI package "
        f"of that name is a placeholder); run this inside {prof.image} "
        f"(see docs/intent.md)."
    )
