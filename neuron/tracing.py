"""Per-target tracing: torch.jit.trace (cpu), torch_neuron (inf1), torch_neuronx (inf2).

The only module of the compile pipeline that imports torch or a Neuron SDK. Each target's tracer
is called exactly as its documentation describes:

- cpu:  ``torch.jit.trace(module, example_inputs)``
- inf1: ``torch_neuron.trace(module, example_inputs=..., compiler_args=[...])``; NeuronCore
  Pipeline is the neuron-cc flag ``--neuroncore-pipeline-cores N`` (the requirements'
  ``--neuron-core-pipeline-cores`` is not a neuron-cc flag:
  docs/design-decisions.md#intent-on-inferentia).
- inf2: ``torch_neuronx.trace(module, example_inputs, compiler_args=[...])``.

All three return TorchScript, saved with ``torch.jit.save`` and loaded with ``torch.jit.load``
after importing the runtime module (inf1/inf2). The SDK check runs before anything is loaded, so
a missing SDK fails in well under a second with the image to use.

Python 3.10-compatible (it runs inside the Inf1 image).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

from neuron.runtime import SdkUnavailableError, load_sdk, neuron_device_paths
from neuron.targets import CompileTarget, profile, sdk_missing_message

__all__ = [
    "SdkUnavailableError",
    "installed_versions",
    "load_sdk",
    "logits_module",
    "require_neuron_device",
    "trace_for_target",
]


def require_neuron_device(target: CompileTarget, dev_dir: str = "/dev") -> None:
    """Raise SdkUnavailableError if a Neuron target has no device to run parity/latency on."""
    if target is CompileTarget.CPU or neuron_device_paths(dev_dir):
        return
    prof = profile(target)
    raise SdkUnavailableError(
        f"target {target.value}: no Neuron device under {dev_dir} (expected {dev_dir}/neuron0). "
        f"Parity and latency run the compiled model, which needs a NeuronCore: run on an "
        f"{target.value} instance inside {prof.image} with --device={dev_dir}/neuron0, or pass "
        f"--skip-device-checks to compile only (the manifest then records no parity or latency)."
    )


def installed_versions(target: CompileTarget) -> dict[str, str]:
    """Versions of the packages the artifact depends on (for the manifest)."""
    prof = profile(target)
    names = ["torch", "transformers", "tokenizers"]
    names += [n for n in (prof.framework_distribution, prof.compiler_distribution) if n]
    versions: dict[str, str] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def logits_module(hf_model: Any) -> Any:
    """Wrap a Hugging Face sequence classifier as ``(input_ids, attention_mask) -> logits``.

    Tracing needs tensors in and a tensor out; ``return_dict=False`` makes the model return a
    tuple whose first element is the logits, in transformers 4.x and 5.x alike.
    """
    import torch

    class SequenceClassifierLogits(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              return_dict=False)[0]

    return SequenceClassifierLogits(hf_model).eval()


def trace_for_target(target: CompileTarget, module: Any, example_inputs: tuple[Any, Any], *,
                     sdk: ModuleType | None, pipeline_cores: int = 1,
                     compiler_args: Sequence[str] = ()) -> Any:
    """Trace ``module`` at the example inputs' fixed shape for ``target``; return TorchScript."""
    import torch

    extra = list(compiler_args)
    with torch.no_grad():
        if target is CompileTarget.CPU:
            if pipeline_cores != 1 or extra:
                raise ValueError("cpu: --pipeline-cores and --compiler-arg apply to Neuron targets")
            return torch.jit.trace(module, example_inputs)
        if sdk is None:
            raise SdkUnavailableError(sdk_missing_message(target, "SDK module not loaded"))
        if target is CompileTarget.INF1:
            if pipeline_cores > 1:
                extra = ["--neuroncore-pipeline-cores", str(pipeline_cores), *extra]
            return sdk.trace(module, example_inputs=example_inputs, compiler_args=extra)
        if pipeline_cores != 1:
            raise ValueError("inf2: NeuronCore Pipeline does not exist in neuronx-cc; "
                             "--pipeline-cores must be 1")
        return sdk.trace(module, example_inputs, compiler_args=extra or None)
