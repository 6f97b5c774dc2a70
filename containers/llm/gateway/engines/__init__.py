"""Engines the gateway can drive, by the name ``serve --engine NAME`` takes.

Each entry maps a name to ``"module:function"``, a builder that takes the validated
:class:`~gateway.settings.Settings` and returns an un-started
:class:`~gateway.engines.base.InferenceEngine`. Builders are imported only when chosen, so the
simulator never imports vLLM or torch (and the vLLM adapter imports vLLM only in ``start()``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from gateway.engines.base import InferenceEngine
from gateway.settings import Settings

EngineBuilder = Callable[[Settings], InferenceEngine]

ENGINE_BUILDERS: dict[str, str] = {
    "sim": "gateway.engines.sim:from_settings",
    "vllm": "gateway.engines.vllm:from_settings",
}


class UnknownEngine(ValueError):
    """``--engine`` named an engine that is not registered in this build."""


def available_engines() -> tuple[str, ...]:
    """Registered engine names, sorted."""
    return tuple(sorted(ENGINE_BUILDERS))


def engine_builder(name: str) -> EngineBuilder:
    """The builder registered as ``name``; UnknownEngine (naming the choices) otherwise."""
    target = ENGINE_BUILDERS.get(name)
    if target is None:
        raise UnknownEngine(
            f"--engine {name!r} is not available in this build; available: "
            f"{', '.join(available_engines())}"
        )
    module_name, _, attribute = target.partition(":")
    builder: EngineBuilder = getattr(importlib.import_module(module_name), attribute)
    return builder
