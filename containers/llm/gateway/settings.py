"""Gateway and engine settings, read from environment variables and validated once at start.

Two prefixes, so nothing collides with vLLM's own ``VLLM_*`` variables:

* ``GATEWAY_*`` — the gateway's own settings (model and adapter locations, routing, context
  budget, admission, circuit breaker, recovery, metrics, test mode).
* ``ENGINE_*`` — engine arguments under vLLM's ``EngineArgs`` names, upper-cased
  (``ENGINE_MAX_MODEL_LEN`` is ``max_model_len``): one row each of the GPU budget's engine
  argument table (:data:`gpu_budget.engine_args.ENGINE_ARGS`), which gives their type, accepted
  values and default — the plan that writes them and the adapter that maps them read the same
  rows.

The CDK stack sets these from the GPU budget. Every variable is declared once in
:data:`SETTING_SPECS` (name, default, meaning); :func:`load_settings` rejects unknown
``GATEWAY_*``/``ENGINE_*`` names (a typo must not silently fall back to a default) and reports
*every* problem in one :class:`SettingsError`, each naming the variable, its value and what is
accepted. Pure module: it reads a mapping, never the filesystem.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from gpu_budget.engine_args import ENGINE_ARG, ENGINE_ARGS, EngineArg, EngineArgError
from intents import INTENT_LABELS
from request_buckets import BUCKET_NAMES, BucketBounds, bucket_bounds
from serving_contract import (
    ADAPTER_NAME_PATTERN,
    AUTO_MODEL,
    BASE_ROUTE,
    DIRECTORY_PATTERN,
    RESERVED_NAMES,
    SERVED_MODEL_NAME_PATTERN,
    FormatError,
    parse_adapters,
    parse_locale_routes,
    parse_routing,
)
from serving_contract.environment import (
    CONTEXT_SHARES,
    DEFAULT_CONTEXT_SPLIT,
    ENGINE_ENV_PREFIX,
    GATEWAY_ADAPTERS,
    GATEWAY_ADAPTERS_DIR,
    GATEWAY_ADMISSION_WAIT_S,
    GATEWAY_ADMISSION_WATERMARK,
    GATEWAY_BREAKER_CLOSE_AFTER_SUCCESSES,
    GATEWAY_BREAKER_CONTEXT_FACTOR,
    GATEWAY_BREAKER_HALF_OPEN_MAX_INFLIGHT,
    GATEWAY_BREAKER_OPEN_S,
    GATEWAY_BUCKET_CAPS,
    GATEWAY_CONTEXT_SPLIT,
    GATEWAY_CONTEXT_STEP_TURNS,
    GATEWAY_CRASH_LOOP_DEATHS,
    GATEWAY_CRASH_LOOP_WINDOW_S,
    GATEWAY_DRAIN_TIMEOUT_S,
    GATEWAY_ENGINE,
    GATEWAY_ENGINE_RESTART_BACKOFF_MAX_S,
    GATEWAY_ENGINE_RESTART_BACKOFF_S,
    GATEWAY_ENGINE_RESTART_MAX_ATTEMPTS,
    GATEWAY_ENV_PREFIX,
    GATEWAY_EXPECTED_KV_TOKENS,
    GATEWAY_LOCALE_ROUTES,
    GATEWAY_MAX_BODY_BYTES,
    GATEWAY_MAX_MESSAGES,
    GATEWAY_MAX_N,
    GATEWAY_METRICS_ENDPOINT_NAME,
    GATEWAY_METRICS_INTERVAL_S,
    GATEWAY_METRICS_VARIANT_NAME,
    GATEWAY_MODEL_DIR,
    GATEWAY_RECOVERY_GRACE_S,
    GATEWAY_REQUEST_DEADLINE_S,
    GATEWAY_RETRY_AFTER_S,
    GATEWAY_ROUTING_TABLE,
    GATEWAY_SERVED_MODEL_NAME,
    GATEWAY_SESSION_MAX,
    GATEWAY_SESSION_TTL_S,
    GATEWAY_SETTINGS,
    GATEWAY_START_CACHE,
    GATEWAY_TEST_MODE,
    GATEWAY_TOKEN_CACHE_MAX_TOKENS,
    GATEWAY_TTFT_SLO_S,
    GATEWAY_WARMUP_TIMEOUT_S,
    RETIRED_SETTINGS,
    Bounds,
    ContextSplit,
    SettingSpec,
    context_split_problems,
)


class SettingsError(ValueError):
    """One or more settings are invalid; the message lists each, naming variable and value."""


SETTING_SPECS: tuple[SettingSpec, ...] = (
    *GATEWAY_SETTINGS,
    # --- engine arguments: the GPU budget's table (vLLM EngineArgs names) -------------------------
    *(SettingSpec(arg.env, arg.default_text, arg.help) for arg in ENGINE_ARGS),
)
"""Every variable the gateway reads: the contract's ``GATEWAY_*`` and one ``ENGINE_*`` per row of
the engine-argument table."""
_KNOWN = {spec.env: spec for spec in SETTING_SPECS}


@dataclass(frozen=True)
class AdapterSpec:
    """A served LoRA adapter: the name clients use and its directory name."""

    name: str
    directory: str


@dataclass(frozen=True)
class BucketPolicy:
    """Request-length buckets: their bounds (from ENGINE_MAX_MODEL_LEN) and concurrency caps."""

    bounds: BucketBounds
    caps: Mapping[str, int]


@dataclass(frozen=True)
class EngineSettings:
    """Engine arguments: one field per row of :data:`gpu_budget.engine_args.ENGINE_ARGS`, under
    the row's name."""

    max_model_len: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    max_loras: int
    max_lora_rank: int
    num_gpu_blocks: int | None
    max_cpu_loras: int | None
    enable_lora: bool
    tensor_parallel_size: int
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    enable_prefix_caching: bool
    enforce_eager: bool
    max_num_queued_reqs: int | None
    load_format: str | None
    attention_backend: str | None


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's own settings (see SETTING_SPECS for each variable)."""

    engine: str
    model_dir: Path
    served_model_name: str
    adapters_dir: Path
    adapters: tuple[AdapterSpec, ...]
    routing_table: Mapping[str, str]
    locale_routes: Mapping[tuple[str, str], str]
    context_split: ContextSplit
    context_step_turns: int
    token_cache_max_tokens: int
    max_messages: int
    max_n: int
    max_body_bytes: int
    admission_watermark: float
    ttft_slo_s: float
    admission_wait_s: float
    retry_after_s: int
    buckets: BucketPolicy
    session_ttl_s: float
    session_max: int
    request_deadline_s: float
    breaker_open_s: float
    breaker_close_after_successes: int
    breaker_half_open_max_inflight: int
    breaker_context_factor: float
    engine_restart_max_attempts: int
    engine_restart_backoff_s: float
    engine_restart_backoff_max_s: float
    crash_loop_deaths: int
    crash_loop_window_s: float
    recovery_grace_s: float
    expected_kv_tokens: int | None
    warmup_timeout_s: float
    drain_timeout_s: float
    metrics_endpoint_name: str
    metrics_variant_name: str
    metrics_interval_s: float
    test_mode: bool
    start_cache: Path | None = None
    """The start cache's directory (None: off); see :func:`_parse_start_cache`."""
    start_cache_explicit: bool = False
    """GATEWAY_START_CACHE named the directory (else it is the model directory's default, which
    may be absent)."""


@dataclass(frozen=True)
class Settings:
    """Everything the gateway process is configured with."""

    gateway: GatewaySettings
    engine: EngineSettings

    def adapter_names(self) -> tuple[str, ...]:
        """Served adapter names in declaration order."""
        return tuple(adapter.name for adapter in self.gateway.adapters)


def _bounds(env: str) -> Bounds:
    """The accepted range of a numeric setting, from its spec (serving_contract.environment)."""
    bounds = _KNOWN[env].bounds
    if bounds is None:
        raise ValueError(f"{env} has no bounds in its SettingSpec")
    return bounds


class _Reader:
    """Reads typed values from the environment, collecting every problem instead of stopping."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[str] = []

    def raw(self, env: str, *, empty_means_default: bool = True) -> str | None:
        """The variable's text; unset (or, for scalars, empty) means the default."""
        value = self.environ.get(env)
        if value is None or (value.strip() == "" and empty_means_default):
            return _KNOWN[env].default
        return value.strip()

    def fail(self, env: str, value: object, accepted: str) -> None:
        self.problems.append(f"{env}={value!r}: {accepted}")

    def text(self, env: str) -> str:
        return self.raw(env) or ""

    def optional_int(self, env: str) -> int | None:
        """An integer at least its spec's lower bound, or None when unset."""
        minimum = int(_bounds(env).low)
        value = self.raw(env)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            self.fail(env, value, f"expected an integer >= {minimum}")
            return None
        if number < minimum:
            self.fail(env, value, f"expected an integer >= {minimum}")
            return None
        return number

    def integer(self, env: str) -> int:
        """An integer within its spec's bounds; on a problem, the default."""
        bounds = _bounds(env)
        minimum = int(bounds.low)
        maximum = None if bounds.high is None else int(bounds.high)
        value = self.raw(env)
        fallback = int(_KNOWN[env].default or minimum)
        accepted = (f"expected an integer in [{minimum}, {maximum}]" if maximum is not None
                    else f"expected an integer >= {minimum}")
        try:
            number = int(value or "")
        except ValueError:
            self.fail(env, value, accepted)
            return fallback
        if number < minimum or (maximum is not None and number > maximum):
            self.fail(env, value, accepted)
            return fallback
        return number

    def number(self, env: str) -> float:
        """A finite number within its spec's bounds; on a problem, the default."""
        bounds = _bounds(env)
        low, high = bounds.low, bounds.high if bounds.high is not None else math.inf
        low_open, high_open = bounds.low_open, bounds.high_open
        value = self.raw(env)
        accepted = (f"expected a number in {'(' if low_open else '['}{low:g}, "
                    f"{high:g}{')' if high_open else ']'}")
        fallback = float(_KNOWN[env].default or low)
        try:
            number = float(value or "")
        except ValueError:
            self.fail(env, value, accepted)
            return fallback
        if (not math.isfinite(number) or number < low or number > high
                or (low_open and number == low) or (high_open and number == high)):
            self.fail(env, value, accepted)
            return fallback
        return number

    def engine_arg(self, arg: EngineArg) -> object:
        """An engine argument parsed and checked by its row of the engine-argument table; on a
        problem, the row's default (so every other problem is still found)."""
        try:
            return arg.parse(self.raw(arg.env))
        except EngineArgError as error:
            self.fail(arg.env, error.shown, error.accepted)
            return arg.default

    def flag(self, env: str) -> bool:
        value = (self.raw(env) or "").lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        self.fail(env, value, "expected true or false")
        return False

    def pairs(self, env: str, separator: str = "=") -> list[tuple[str, str]]:
        # A list set to "" is the empty list (GATEWAY_ADAPTERS= serves the base model only);
        # only an unset variable takes the default.
        value = self.raw(env, empty_means_default=False) or ""
        result: list[tuple[str, str]] = []
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            key, sep, rest = item.partition(separator)
            if not sep or not key.strip() or not rest.strip():
                self.fail(env, value, f"expected comma-separated key{separator}value pairs, "
                                      f"bad item {item!r}")
                return []
            result.append((key.strip(), rest.strip()))
        return result


def _parse_adapters(reader: _Reader, served_model_name: str) -> tuple[AdapterSpec, ...]:
    env = GATEWAY_ADAPTERS
    # Set to "" it is the empty list (the base model only); only unset takes the default.
    try:
        pairs = parse_adapters(reader.raw(env, empty_means_default=False) or "")
    except FormatError as error:
        reader.fail(env, reader.raw(env), str(error))
        return ()
    adapters: list[AdapterSpec] = []
    for name, directory in pairs:
        if not ADAPTER_NAME_PATTERN.match(name) or name in RESERVED_NAMES \
                or name == served_model_name:
            reader.fail(env, name,
                        f"adapter names match {ADAPTER_NAME_PATTERN.pattern} and are not "
                        f"'{BASE_ROUTE}', '{AUTO_MODEL}' or the served model name")
        elif any(existing.name == name for existing in adapters):
            reader.fail(env, name, "each adapter name once")
        elif not DIRECTORY_PATTERN.match(directory) or directory in (".", ".."):
            reader.fail(env, directory,
                        "a directory name inside GATEWAY_ADAPTERS_DIR, not a path")
        else:
            adapters.append(AdapterSpec(name=name, directory=directory))
    return tuple(adapters)


def _parse_routing(reader: _Reader, adapter_names: set[str]) -> dict[str, str]:
    env = GATEWAY_ROUTING_TABLE
    try:
        pairs = parse_routing(reader.raw(env, empty_means_default=False) or "")
    except FormatError as error:
        reader.fail(env, reader.raw(env), str(error))
        return {}
    table: dict[str, str] = {}
    targets = sorted(adapter_names | {BASE_ROUTE})
    for intent, target in pairs:
        if intent not in INTENT_LABELS:
            reader.fail(env, intent, f"keys are intents: {', '.join(INTENT_LABELS)}")
        elif target not in adapter_names and target != BASE_ROUTE:
            reader.fail(env, f"{intent}={target}",
                        f"values are served adapters or '{BASE_ROUTE}': {', '.join(targets)}")
        else:
            table[intent] = target
    return table


def _parse_locale_routes(reader: _Reader, adapter_names: set[str]) -> dict[tuple[str, str], str]:
    env = GATEWAY_LOCALE_ROUTES
    raw = reader.raw(env, empty_means_default=False) or ""
    known = adapter_names | {BASE_ROUTE}
    accepted = ("expected locale:adapter=replacement[,adapter=replacement][;locale:...] "
                f"(e.g. ja-JP:manga=manga-ja) naming served adapters or '{BASE_ROUTE}'")
    try:
        parsed = parse_locale_routes(raw)
    except FormatError as error:
        reader.fail(env, raw, f"{accepted}; bad item {error.item!r}")
        return {}
    routes: dict[tuple[str, str], str] = {}
    for locale, table in parsed.items():
        for source, replacement in table.items():
            if source not in known or replacement not in known:
                reader.fail(env, raw, f"{accepted}; bad item {source}={replacement}")
                return routes
            routes[(locale, source)] = replacement
    return routes


def _parse_split(reader: _Reader) -> ContextSplit:
    env = GATEWAY_CONTEXT_SPLIT
    shares: dict[str, float] = {}
    for key, value in reader.pairs(env):
        try:
            share = float(value)
        except ValueError:
            share = -1.0
        if key not in CONTEXT_SHARES or not 0.0 <= share <= 1.0:
            reader.fail(env, f"{key}={value}",
                        f"keys {', '.join(CONTEXT_SHARES)} with shares in [0, 1]")
            continue
        shares[key] = share
    missing = set(CONTEXT_SHARES) - set(shares)
    if missing and not any(problem.startswith(env) for problem in reader.problems):
        reader.fail(env, reader.raw(env), f"missing share(s): {', '.join(sorted(missing))}")
    # A missing share is already a problem; the default's keeps the remaining checks meaningful.
    split = replace(DEFAULT_CONTEXT_SPLIT, **shares)
    for problem in context_split_problems(split):
        reader.fail(env, reader.raw(env), problem)
    return split


def _parse_buckets(reader: _Reader, max_model_len: int) -> BucketPolicy:
    caps: dict[str, int] = {}
    for key, value in reader.pairs(GATEWAY_BUCKET_CAPS):
        if key not in BUCKET_NAMES or not value.isdigit() or int(value) < 1:
            reader.fail(GATEWAY_BUCKET_CAPS, f"{key}={value}",
                        f"keys {', '.join(BUCKET_NAMES)} with concurrency caps >= 1")
            continue
        caps[key] = int(value)
    if set(caps) != set(BUCKET_NAMES) and not any(
            p.startswith(GATEWAY_BUCKET_CAPS) for p in reader.problems):
        reader.fail(GATEWAY_BUCKET_CAPS, reader.raw(GATEWAY_BUCKET_CAPS),
                    f"all of {', '.join(BUCKET_NAMES)} are required")
    # Every bucket is required: with one missing, the settings are refused (no default here).
    return BucketPolicy(bounds=bucket_bounds(max_model_len), caps=caps)


def _parse_engine(reader: _Reader) -> EngineSettings:
    engine_args = {arg.name: reader.engine_arg(arg) for arg in ENGINE_ARGS}
    return EngineSettings(**engine_args)  # type: ignore[arg-type]  # each typed by its row


def load_settings(environ: Mapping[str, str]) -> Settings:
    """Read and validate every setting; raise SettingsError listing all problems."""
    reader = _Reader(environ)
    for name in sorted(environ):
        if name in RETIRED_SETTINGS:
            reader.problems.append(f"{name}: no longer a setting: {RETIRED_SETTINGS[name]}")
        elif name.startswith((GATEWAY_ENV_PREFIX, ENGINE_ENV_PREFIX)) and name not in _KNOWN:
            close = difflib.get_close_matches(name, list(_KNOWN), n=1, cutoff=0.85)
            hint = f" (did you mean {close[0]}?)" if close else ""
            reader.problems.append(f"{name}: not a known setting{hint}")

    engine_name = reader.text(GATEWAY_ENGINE)
    served = reader.text(GATEWAY_SERVED_MODEL_NAME)
    if not SERVED_MODEL_NAME_PATTERN.match(served) or served in RESERVED_NAMES:
        reader.fail(GATEWAY_SERVED_MODEL_NAME, served,
                    f"a name matching {SERVED_MODEL_NAME_PATTERN.pattern}, not "
                    f"'{AUTO_MODEL}'/'{BASE_ROUTE}'")
    model_dir = Path(reader.text(GATEWAY_MODEL_DIR))
    adapters_dir_raw = reader.raw(GATEWAY_ADAPTERS_DIR)
    adapters = _parse_adapters(reader, served)
    adapter_names = {adapter.name for adapter in adapters}
    engine = _parse_engine(reader)
    gateway = GatewaySettings(
        engine=engine_name,
        model_dir=model_dir,
        served_model_name=served,
        adapters_dir=Path(adapters_dir_raw) if adapters_dir_raw else model_dir / "adapters",
        adapters=adapters,
        routing_table=_parse_routing(reader, adapter_names),
        locale_routes=_parse_locale_routes(reader, adapter_names),
        context_split=_parse_split(reader),
        context_step_turns=reader.integer(GATEWAY_CONTEXT_STEP_TURNS),
        token_cache_max_tokens=reader.integer(GATEWAY_TOKEN_CACHE_MAX_TOKENS),
        max_messages=reader.integer(GATEWAY_MAX_MESSAGES),
        max_n=reader.integer(GATEWAY_MAX_N),
        max_body_bytes=reader.integer(GATEWAY_MAX_BODY_BYTES),
        admission_watermark=reader.number(GATEWAY_ADMISSION_WATERMARK),
        ttft_slo_s=reader.number(GATEWAY_TTFT_SLO_S),
        admission_wait_s=reader.number(GATEWAY_ADMISSION_WAIT_S),
        retry_after_s=reader.integer(GATEWAY_RETRY_AFTER_S),
        buckets=_parse_buckets(reader, engine.max_model_len),
        session_ttl_s=reader.number(GATEWAY_SESSION_TTL_S),
        session_max=reader.integer(GATEWAY_SESSION_MAX),
        request_deadline_s=reader.number(GATEWAY_REQUEST_DEADLINE_S),
        breaker_open_s=reader.number(GATEWAY_BREAKER_OPEN_S),
        breaker_close_after_successes=reader.integer(GATEWAY_BREAKER_CLOSE_AFTER_SUCCESSES),
        breaker_half_open_max_inflight=reader.integer(GATEWAY_BREAKER_HALF_OPEN_MAX_INFLIGHT),
        breaker_context_factor=reader.number(GATEWAY_BREAKER_CONTEXT_FACTOR),
        engine_restart_max_attempts=reader.integer(GATEWAY_ENGINE_RESTART_MAX_ATTEMPTS),
        engine_restart_backoff_s=reader.number(GATEWAY_ENGINE_RESTART_BACKOFF_S),
        engine_restart_backoff_max_s=reader.number(GATEWAY_ENGINE_RESTART_BACKOFF_MAX_S),
        crash_loop_deaths=reader.integer(GATEWAY_CRASH_LOOP_DEATHS),
        crash_loop_window_s=reader.number(GATEWAY_CRASH_LOOP_WINDOW_S),
        recovery_grace_s=reader.number(GATEWAY_RECOVERY_GRACE_S),
        expected_kv_tokens=reader.optional_int(GATEWAY_EXPECTED_KV_TOKENS),
        warmup_timeout_s=reader.number(GATEWAY_WARMUP_TIMEOUT_S),
        drain_timeout_s=reader.number(GATEWAY_DRAIN_TIMEOUT_S),
        metrics_endpoint_name=reader.text(GATEWAY_METRICS_ENDPOINT_NAME),
        metrics_variant_name=reader.text(GATEWAY_METRICS_VARIANT_NAME),
        metrics_interval_s=reader.number(GATEWAY_METRICS_INTERVAL_S),
        test_mode=reader.flag(GATEWAY_TEST_MODE),
    )
    start_cache, explicit = _parse_start_cache(reader, model_dir)
    gateway = replace(gateway, start_cache=start_cache, start_cache_explicit=explicit)
    _cross_check(reader, gateway, engine)
    if reader.problems:
        raise SettingsError("invalid settings: " + "; ".join(reader.problems))
    return Settings(gateway=gateway, engine=engine)


START_CACHE_OFF = "off"
START_CACHE_DEFAULT = "start-cache"
"""The start cache's folder inside the model directory, used when GATEWAY_START_CACHE is unset
(``gateway.start_cache.fingerprint.CACHE_DIR_NAME`` is the same name)."""


def _parse_start_cache(reader: _Reader, model_dir: Path) -> tuple[Path | None, bool]:
    """GATEWAY_START_CACHE: ``off``, an absolute directory, or unset (the model directory's
    ``start-cache`` folder, used only when it exists): the directory, and whether it was named.
    Whether it exists is the loader's check (this module reads no files)."""
    raw = reader.raw(GATEWAY_START_CACHE)
    if raw is None:
        return model_dir / START_CACHE_DEFAULT, False
    if raw.lower() == START_CACHE_OFF:
        return None, False
    if not raw.startswith("/"):
        reader.fail(GATEWAY_START_CACHE, raw,
                    f"expected {START_CACHE_OFF!r} or an absolute directory path (unset: "
                    f"<{GATEWAY_MODEL_DIR}>/{START_CACHE_DEFAULT} when it exists)")
        return None, False
    return Path(raw), True


def _cross_check(reader: _Reader, gateway: GatewaySettings, engine: EngineSettings) -> None:
    if engine.max_cpu_loras is not None and engine.max_cpu_loras < engine.max_loras:
        reader.fail(ENGINE_ARG["max_cpu_loras"].env, engine.max_cpu_loras,
                    f"must be at least ENGINE_MAX_LORAS={engine.max_loras}")
    if gateway.adapters and not engine.enable_lora:
        reader.fail(ENGINE_ARG["enable_lora"].env, "false",
                    "must be true while GATEWAY_ADAPTERS names adapters (set GATEWAY_ADAPTERS= "
                    "to serve the base model only)")
    if gateway.admission_wait_s >= gateway.request_deadline_s:
        reader.fail(GATEWAY_ADMISSION_WAIT_S, gateway.admission_wait_s,
                    f"must be below GATEWAY_REQUEST_DEADLINE_S={gateway.request_deadline_s:g}")
    if gateway.engine_restart_backoff_s > gateway.engine_restart_backoff_max_s:
        reader.fail(GATEWAY_ENGINE_RESTART_BACKOFF_S, gateway.engine_restart_backoff_s,
                    "must not exceed GATEWAY_ENGINE_RESTART_BACKOFF_MAX_S="
                    f"{gateway.engine_restart_backoff_max_s:g}")
    if math.floor(gateway.context_split.output * engine.max_model_len) < 1:
        reader.fail(GATEWAY_CONTEXT_SPLIT, reader.raw(GATEWAY_CONTEXT_SPLIT),
                    f"the output share gives no token at ENGINE_MAX_MODEL_LEN="
                    f"{engine.max_model_len}")
    for label in (GATEWAY_METRICS_ENDPOINT_NAME, GATEWAY_METRICS_VARIANT_NAME):
        value = reader.text(label)
        if not value or len(value) > 255:
            reader.fail(label, value, "a non-empty name of at most 255 characters")


def settings_reference_markdown() -> str:
    """A Markdown table of every variable, its default and meaning (for docs/gateway.md)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for spec in SETTING_SPECS:
        default = f"`{spec.default}`" if spec.default is not None else "unset"
        lines.append(f"| `{spec.env}` | {default} | {spec.help} |")
    return "\n".join(lines)
