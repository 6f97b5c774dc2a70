"""The LoRA adapters the quality gate evaluates: which set each is gated on, and what a PEFT
adapter folder holds.

Production answers two of every three requests through an adapter trained on the fp16 base and
served on its AWQ quantization (``config/prod.yaml``: ``llm.adapters``, ``llm.routing``,
``llm.locale_routes``). The gate therefore evaluates, for each adapter, base+adapter in fp16
against AWQ-base+adapter on that adapter's own evaluation set:

==========  ==========================================  =====================================
adapter     what the routing table sends it             its set (``quantization/data/``)
==========  ==========================================  =====================================
``manga``     product_question, recommendation,         ``eval_manga.jsonl`` (English)
              discovery (every locale but ja-JP)
``support``   order_tracking, return_request,           ``eval_support.jsonl`` (ja and en)
              escalation
``manga-ja``  the ``manga`` intents in ja-JP            ``eval_manga_ja.jsonl`` (Japanese)
==========  ==========================================  =====================================

Every item of those sets names its ``intent``; :func:`served_tasks` derives from a routing table
what each adapter answers, and the tests check each set against it for every configuration.

Pure module: standard library only (the generators apply the adapter: quantization/generation.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
BASE_EVAL_SET = DATA_DIR / "eval_set.jsonl"
ADAPTER_EVAL_SETS: dict[str, Path] = {
    "manga": DATA_DIR / "eval_manga.jsonl",
    "support": DATA_DIR / "eval_support.jsonl",
    "manga-ja": DATA_DIR / "eval_manga_ja.jsonl",
}
"""The evaluation set of each served adapter, by its served name (``llm.adapters[].name``)."""

LOCALE_LANGUAGES: dict[str, str] = {"ja-JP": "ja"}
"""The language of each locale a locale route names (every other locale: English)."""
BASE_ROUTE = "base"

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


class AdapterError(ValueError):
    """An adapter folder or option the gate cannot use; the message names the field."""


def parse_named(values: Sequence[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` options (``--adapter manga=/path``) as a dict, each name once."""
    named: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise AdapterError(f"{option}: {value!r} is not accepted; use NAME=VALUE, e.g. "
                               f"{option} manga=adapters/manga_domain")
        if name.strip() in named:
            raise AdapterError(f"{option}: {name.strip()!r} is given twice; each name once")
        named[name.strip()] = rest.strip()
    return named


def default_eval_set(name: str) -> Path:
    """The evaluation set of a served adapter; AdapterError for a name without one."""
    try:
        return ADAPTER_EVAL_SETS[name]
    except KeyError:
        raise AdapterError(
            f"--adapter: {name!r} has no evaluation set; accepted: "
            f"{', '.join(sorted(ADAPTER_EVAL_SETS))}, or give --adapter-eval-set "
            f"{name}=FILE.jsonl") from None


def served_tasks(routing: Mapping[str, str],
                 locale_routes: Mapping[str, Mapping[str, str]]
                 ) -> dict[str, set[tuple[str, str]]]:
    """``adapter -> {(intent, language)}`` it answers under a routing table (``intent ->
    adapter``) and its locale routes (``locale -> {adapter: replacement}``). Languages are
    ``ja`` and ``en``; a locale route moves its locale's language from one adapter to another."""
    tasks: dict[str, set[tuple[str, str]]] = {}
    for intent, adapter in routing.items():
        if adapter == BASE_ROUTE:
            continue
        for language in ("ja", "en"):
            target = adapter
            for locale, replacements in locale_routes.items():
                if LOCALE_LANGUAGES.get(locale, "en") == language and adapter in replacements:
                    target = replacements[adapter]
            if target != BASE_ROUTE:
                tasks.setdefault(target, set()).add((intent, language))
    return tasks


# --- PEFT LoRA folders ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraWeights:
    """A PEFT LoRA adapter: ``scale`` and, per target module, its (lora_A, lora_B) keys."""

    scale: float
    modules: dict[str, tuple[str, str]]


def lora_scale(config: Mapping[str, object], *, where: str) -> float:
    """``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA), from ``adapter_config.json``."""
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"{where}: r: {rank!r} is not accepted; a LoRA rank of 1 or more")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise AdapterError(f"{where}: lora_alpha: {alpha!r} is not accepted; a positive number")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{where}: peft_type: {config.get('peft_type')!r} is not accepted; "
                           "LORA")
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)


def lora_modules(keys: Sequence[str], *, where: str) -> dict[str, tuple[str, str]]:
    """``module name -> (lora_A key, lora_B key)`` from a PEFT weights file's tensor names
    (``base_model.model.<module>.lora_A.weight``); every module needs both."""
    found: dict[str, dict[str, str]] = {}
    for key in keys:
        suffix = next((s for s in _LORA_SUFFIXES if key.endswith(s)), None)
        if suffix is None or not key.startswith(_PEFT_PREFIX):
            raise AdapterError(f"{where}: tensor {key!r} is not accepted; expected "
                               f"{_PEFT_PREFIX}<module>.lora_A.weight / .lora_B.weight")
        module = key[len(_PEFT_PREFIX):-len(suffix)]
        found.setdefault(module, {})[suffix] = key
    pairs: dict[str, tuple[str, str]] = {}
    for module, parts in sorted(found.items()):
        if len(parts) != 2:
            raise AdapterError(f"{where}: module {module!r} has only "
                               f"{', '.join(sorted(parts))}; LoRA needs lora_A and lora_B")
        pairs[module] = (parts[_LORA_SUFFIXES[0]], parts[_LORA_SUFFIXES[1]])
    if not pairs:
        raise AdapterError(f"{where}: no LoRA tensors")
    return pairs


def read_adapter_config(adapter_dir: Path) -> dict[str, object]:
    """``adapter_config.json`` of an adapter folder; AdapterError naming the file if unusable."""
    path = adapter_dir / ADAPTER_CONFIG
    weights = adapter_dir / ADAPTER_WEIGHTS
    if not path.is_file() or not weights.is_file():
        raise AdapterError(f"--adapter: {str(adapter_dir)!r} is not accepted; a PEFT LoRA folder "
                           f"with {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise AdapterError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: expected a JSON object")
    return config
