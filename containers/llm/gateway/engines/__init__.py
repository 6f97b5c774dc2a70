"""Engines the gateway can drive, by the name ``serve --engine NAME`` takes.

Each entry maps a name to ``"module:function"``, a builder that takes the validated
:class:`~gateway.settings.Settings` and returns an un-started
:class:`~gateway.engines.base.InferenceEngine`. Builders are imported only when chosen (the vLLM
adapter imports vLLM only in ``start()``). The image ships one engine, vLLM; the test side adds
its simulated engine through ``gateway.main.run(engines=...)`` (``tests/support/sim_serve.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

from gateway.engines.base import InferenceEngine
from gateway.settings import Settings

EngineBuilder = Callable[[Settings], InferenceEngine]

ENGINE_BUILDERS: Mapping[str, str] = {
    "vllm": "gateway.engines.vllm:from_settings",
}


class UnknownEngine(ValueError):
    """``--engine`` named an engine that is not registered in this build."""


def available_engines(extra: Mapping[str, EngineBuilder] | None = None) -> tuple[str, ...]:
    """Registered engine names (and those of ``extra``), sorted."""
    return tuple(sorted({*ENGINE_BUILDERS, *(extra or {})}))


def engine_builder(name: str, extra: Mapping[str, EngineBuilder] | None = None
                   ) -> EngineBuilder:
    """The builder of ``extra`` or registered as ``name``; UnknownEngine (naming the choices)
    otherwise. ``extra``: builders the caller brings (the test side's simulator)."""
    if extra and name in extra:
        return extra[name]
    target = ENGINE_BUILDERS.get(name)
    if target is None:
        raise UnknownEngine(
            f"--engine {name!r} is not available in this build; available: "
            f"{', '.join(available_engines(extra))}"
        )
    module_name, _, attribute = target.partition(":")
    builder: EngineBuilder = getattr(importlib.import_module(module_name), attribute)
    return builder
