"""Which LoRA adapter (or the base model) answers a request.

The adapters and who gets which: docs/design-decisions.md#lora-adapters.

Order of decision:

1. ``model`` names the base model (``GATEWAY_SERVED_MODEL_NAME``) or a served adapter: that one,
   whatever the intent or locale (an explicit choice wins; vLLM's convention for LoRA serving).
2. ``model`` absent or ``"auto"``: the intent picks from the routing table (unlisted intents and
   requests without an intent get the base model), then a locale route may replace the choice
   (``ja-JP`` + ``manga`` → ``manga-ja``).
3. Any other ``model`` is an unknown model: a 404 naming the served names.

Pure module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.engines.base import AdapterRef, adapter_refs
from gateway.settings import AdapterSpec
from serving_contract import AUTO_MODEL, BASE_ROUTE, normalize_locale


class UnknownModel(LookupError):
    """``model`` names neither the base model nor a served adapter."""


@dataclass(frozen=True)
class RouteDecision:
    """The routing outcome: the adapter (None for the base model) and why."""

    adapter: AdapterRef | None
    served_name: str
    reason: str
    """``model`` (explicit), ``intent``, ``intent+locale`` or ``default`` (no intent)."""


class AdapterRouter:
    """Resolves ``model`` / intent / locale to an adapter (see the module docstring)."""

    def __init__(
        self,
        *,
        served_model_name: str,
        adapters: Sequence[AdapterSpec],
        adapters_dir: Path,
        routing_table: Mapping[str, str],
        locale_routes: Mapping[tuple[str, str], str],
    ) -> None:
        self.served_model_name = served_model_name
        self.adapters = adapter_refs(adapters, adapters_dir)
        self.routing_table = dict(routing_table)
        self.locale_routes = dict(locale_routes)
        for target in (*self.routing_table.values(), *self.locale_routes.values()):
            if target != BASE_ROUTE and target not in self.adapters:
                raise ValueError(f"routing names {target!r}, which is not a served adapter")

    def served_names(self) -> list[str]:
        """Every name ``model`` accepts (besides ``auto``): the base model, then the adapters."""
        return [self.served_model_name, *self.adapters]

    def resolve(self, model: str | None, intent: str | None, locale: str | None) -> RouteDecision:
        """Pick the adapter; UnknownModel if ``model`` names nothing served."""
        if model is not None and model != AUTO_MODEL:
            if model == self.served_model_name:
                return RouteDecision(adapter=None, served_name=model, reason="model")
            adapter = self.adapters.get(model)
            if adapter is None:
                shown = model if len(model) <= 80 else model[:77] + "..."
                raise UnknownModel(
                    f"model {shown!r} is not served here; use one of "
                    f"{', '.join(self.served_names())} or '{AUTO_MODEL}' to route by intent"
                )
            return RouteDecision(adapter=adapter, served_name=model, reason="model")
        if intent is None:
            return self._decision(BASE_ROUTE, "default")
        target = self.routing_table.get(intent, BASE_ROUTE)
        if locale is not None:
            replacement = self.locale_routes.get((normalize_locale(locale), target))
            if replacement is not None:
                return self._decision(replacement, "intent+locale")
        return self._decision(target, "intent")

    def _decision(self, target: str, reason: str) -> RouteDecision:
        if target == BASE_ROUTE:
            return RouteDecision(adapter=None, served_name=self.served_model_name, reason=reason)
        return RouteDecision(adapter=self.adapters[target], served_name=target, reason=reason)
