"""Importing a target's Neuron runtime, and finding Neuron devices: shared by compiler and server.

``torch.jit.load`` of a Neuron-compiled model only works after ``import torch_neuron`` (inf1) or
``import torch_neuronx`` (inf2), which register the Neuron ops with TorchScript. Both packages
exist only in the Neuron images; PyPI's packages of those names are placeholders whose import
raises ``ImportError("WRONG PACKAGE ...")``. Either way the error names the image to use.

Standard library only at import time, Python 3.10-compatible.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
from types import ModuleType

from neuron.targets import CompileTarget, profile, sdk_missing_message


class SdkUnavailableError(RuntimeError):
    """The target's Neuron SDK (or a NeuronCore) is not available in this environment."""


def require_sdk_installed(target: CompileTarget) -> None:
    """Raise SdkUnavailableError if the target's framework module is not installed at all.

    Does not import it: the server checks this first, then sets the Neuron runtime's environment
    (NEURON_RT_NUM_CORES), then imports.
    """
    module = profile(target).runtime_module
    if module is not None and importlib.util.find_spec(module) is None:
        raise SdkUnavailableError(sdk_missing_message(target, f"module {module} is not installed"))


def load_sdk(target: CompileTarget) -> ModuleType | None:
    """Import the target's Neuron framework module (None for cpu) or raise SdkUnavailableError."""
    prof = profile(target)
    if prof.runtime_module is None:
        return None
    require_sdk_installed(target)
    try:
        return importlib.import_module(prof.runtime_module)
    except ImportError as error:
        raise SdkUnavailableError(sdk_missing_message(
            target, f"importing {prof.runtime_module} failed ({error})")) from None


def neuron_device_paths(dev_dir: str = "/dev") -> list[str]:
    """The Neuron devices visible to this process (``/dev/neuron0`` ...)."""
    return sorted(glob.glob(os.path.join(dev_dir, "neuron[0-9]*")))
