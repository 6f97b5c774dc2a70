"""The LLM serving container's environment: every ``GATEWAY_*`` name, its default and meaning.

SageMaker hands the container its settings as environment variables. The stack writes them
(``stacks/llm_endpoint.py``; the capacity plan and the GPU budget add theirs:
``capacity_model/plan.py``, ``gpu_budget/memory_plan.py``) and the gateway reads them back
(``containers/llm/gateway/settings.py``). Both sides import the names from here, so a renamed or
retired variable is one edit and no side can write a name the other does not read; nothing else
in the product types a ``GATEWAY_`` name (``tests/test_environment_contract.py`` checks).

Two prefixes, so nothing collides with vLLM's own ``VLLM_*`` variables:

* ``GATEWAY_*`` — the gateway's own settings, one :class:`SettingSpec` each in
  :data:`GATEWAY_SETTINGS` (name, default, meaning). The gateway's loader checks each value's
  type and bounds and names them in its errors.
* ``ENGINE_*`` — vLLM engine arguments, one per row of the GPU budget's table
  (:data:`gpu_budget.engine_args.ENGINE_ARGS`): a row's variable is ``ENGINE_ENV_PREFIX`` + its
  name upper-cased (:attr:`gpu_budget.engine_args.EngineArg.env`,
  :func:`gpu_budget.engine_args.engine_env_var`). The prefix is defined here and the table
  imports it; the names are never typed anywhere else.

:data:`DEFAULT_CONTEXT_SPLIT` is the seed's split of the context window (512 system + 1,024 RAG
+ 2,048 history + 512 output of 4,096): the gateway's default for ``GATEWAY_CONTEXT_SPLIT`` and
the stack settings' default for their context window (``stacks/`` reads its four shares from
here), so the two can never disagree. :data:`DEFAULT_BUCKET_CAPS` is the gateway's default
concurrency per request bucket, keyed by :data:`request_buckets.BUCKET_NAMES`.

Pure module, standard library and ``request_buckets`` only, Python 3.10+.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from request_buckets import BUCKET_NAMES

GATEWAY_ENV_PREFIX = "GATEWAY_"
"""The gateway's own settings."""
ENGINE_ENV_PREFIX = "ENGINE_"
"""Engine arguments travel as ``ENGINE_<NAME>`` (never ``VLLM_*``, which vLLM reads itself)."""

# --- names the stack side writes -----------------------------------------------------------------
GATEWAY_ENGINE = "GATEWAY_ENGINE"
GATEWAY_MODEL_DIR = "GATEWAY_MODEL_DIR"
GATEWAY_SERVED_MODEL_NAME = "GATEWAY_SERVED_MODEL_NAME"
GATEWAY_ADAPTERS_DIR = "GATEWAY_ADAPTERS_DIR"
GATEWAY_ADAPTERS = "GATEWAY_ADAPTERS"
GATEWAY_ROUTING_TABLE = "GATEWAY_ROUTING_TABLE"
GATEWAY_LOCALE_ROUTES = "GATEWAY_LOCALE_ROUTES"
GATEWAY_CONTEXT_SPLIT = "GATEWAY_CONTEXT_SPLIT"
GATEWAY_CONTEXT_STEP_TURNS = "GATEWAY_CONTEXT_STEP_TURNS"
GATEWAY_ADMISSION_WATERMARK = "GATEWAY_ADMISSION_WATERMARK"
GATEWAY_TTFT_SLO_S = "GATEWAY_TTFT_SLO_S"
GATEWAY_BUCKET_CAPS = "GATEWAY_BUCKET_CAPS"
GATEWAY_SESSION_TTL_S = "GATEWAY_SESSION_TTL_S"
GATEWAY_EXPECTED_KV_TOKENS = "GATEWAY_EXPECTED_KV_TOKENS"
GATEWAY_METRICS_ENDPOINT_NAME = "GATEWAY_METRICS_ENDPOINT_NAME"
GATEWAY_METRICS_VARIANT_NAME = "GATEWAY_METRICS_VARIANT_NAME"
# --- names only the gateway reads (their defaults serve production) -----------------------------
GATEWAY_TOKEN_CACHE_MAX_TOKENS = "GATEWAY_TOKEN_CACHE_MAX_TOKENS"
GATEWAY_MAX_MESSAGES = "GATEWAY_MAX_MESSAGES"
GATEWAY_MAX_N = "GATEWAY_MAX_N"
GATEWAY_MAX_BODY_BYTES = "GATEWAY_MAX_BODY_BYTES"
GATEWAY_ADMISSION_WAIT_S = "GATEWAY_ADMISSION_WAIT_S"
GATEWAY_RETRY_AFTER_S = "GATEWAY_RETRY_AFTER_S"
GATEWAY_SESSION_MAX = "GATEWAY_SESSION_MAX"
GATEWAY_REQUEST_DEADLINE_S = "GATEWAY_REQUEST_DEADLINE_S"
GATEWAY_BREAKER_OPEN_S = "GATEWAY_BREAKER_OPEN_S"
GATEWAY_BREAKER_CLOSE_AFTER_SUCCESSES = "GATEWAY_BREAKER_CLOSE_AFTER_SUCCESSES"
GATEWAY_BREAKER_HALF_OPEN_MAX_INFLIGHT = "GATEWAY_BREAKER_HALF_OPEN_MAX_INFLIGHT"
GATEWAY_BREAKER_CONTEXT_FACTOR = "GATEWAY_BREAKER_CONTEXT_FACTOR"
GATEWAY_ENGINE_RESTART_MAX_ATTEMPTS = "GATEWAY_ENGINE_RESTART_MAX_ATTEMPTS"
GATEWAY_ENGINE_RESTART_BACKOFF_S = "GATEWAY_ENGINE_RESTART_BACKOFF_S"
GATEWAY_ENGINE_RESTART_BACKOFF_MAX_S = "GATEWAY_ENGINE_RESTART_BACKOFF_MAX_S"
GATEWAY_CRASH_LOOP_DEATHS = "GATEWAY_CRASH_LOOP_DEATHS"
GATEWAY_CRASH_LOOP_WINDOW_S = "GATEWAY_CRASH_LOOP_WINDOW_S"
GATEWAY_RECOVERY_GRACE_S = "GATEWAY_RECOVERY_GRACE_S"
GATEWAY_WARMUP_TIMEOUT_S = "GATEWAY_WARMUP_TIMEOUT_S"
GATEWAY_DRAIN_TIMEOUT_S = "GATEWAY_DRAIN_TIMEOUT_S"
GATEWAY_METRICS_INTERVAL_S = "GATEWAY_METRICS_INTERVAL_S"
GATEWAY_TEST_MODE = "GATEWAY_TEST_MODE"
GATEWAY_START_CACHE = "GATEWAY_START_CACHE"

RETIRED_SETTINGS: Mapping[str, str] = {
    "GATEWAY_BUCKET_BOUNDS": "the bucket bounds follow ENGINE_MAX_MODEL_LEN (request_buckets: "
    "S <= 1/8, M <= 1/4, L <= 1/2 of it, XL above), so the gateway, the GPU budget and the "
    "dashboard mean the same buckets; remove the variable",
}
"""Variables that no longer exist, with what replaced them (the gateway refuses them)."""


@dataclass(frozen=True)
class ContextSplit:
    """Shares of max_model_len for system+pinned, RAG, history and the default output."""

    system: float
    rag: float
    history: float
    output: float


CONTEXT_SHARES: tuple[str, ...] = ("system", "rag", "history", "output")
"""The keys of ``GATEWAY_CONTEXT_SPLIT``, in its order (the fields of :class:`ContextSplit`)."""

DEFAULT_CONTEXT_SPLIT = ContextSplit(system=0.125, rag=0.25, history=0.5, output=0.125)
"""The seed's split: 512/1,024/2,048/512 of 4,096 (docs/design-decisions.md#context-split).
The gateway's default and the stack settings' default (``stacks/``: ContextWindowSettings)."""

SHARE_TOLERANCE = 1e-9
"""How far above 1 the shares' sum may round (decimal shares are not exact in binary)."""


def context_split_problems(split: ContextSplit) -> list[str]:
    """What in ``split`` breaks ``GATEWAY_CONTEXT_SPLIT``'s rules (empty: nothing): each share
    from 0 to 1, the shares add up to at most 1, history and output above 0. The one check, for
    the gateway's settings, the stack settings and the capacity model alike."""
    shares = {name: getattr(split, name) for name in CONTEXT_SHARES}
    problems = []
    outside = [f"{name}={share:g}" for name, share in shares.items() if not 0 <= share <= 1]
    if outside:
        problems.append(f"shares are from 0 to 1, got {', '.join(outside)}")
    total = sum(shares.values())
    if total > 1 + SHARE_TOLERANCE:
        problems.append(f"shares add up to {total:g}; they must add up to at most 1")
    if split.history <= 0 or split.output <= 0:
        problems.append("history and output shares must be above 0")
    return problems


DEFAULT_BUCKET_CAPS: Mapping[str, int] = dict(zip(BUCKET_NAMES, (128, 64, 32, 8), strict=True))
"""Concurrent requests per bucket when ``GATEWAY_BUCKET_CAPS`` is unset."""


def format_context_split(split: ContextSplit) -> str:
    """``GATEWAY_CONTEXT_SPLIT``'s text: ``system=..,rag=..,history=..,output=..``."""
    return ",".join(f"{name}={getattr(split, name):g}" for name in CONTEXT_SHARES)


def format_bucket_caps(caps: Mapping[str, int]) -> str:
    """``GATEWAY_BUCKET_CAPS``'s text: ``S=..,M=..,L=..,XL=..`` in bucket order."""
    return ",".join(f"{name}={caps[name]}" for name in BUCKET_NAMES if name in caps)


SAGEMAKER_INVOKE_TIMEOUT_S = 60.0
"""SageMaker's InvokeEndpoint limit: a request's deadline stays below it."""
SAGEMAKER_SIGKILL_AFTER_S = 30.0
"""SageMaker kills a container this long after SIGTERM: the drain stays below it."""
MAX_N_SCHEMA = 16
"""The request schema's bound on ``n``; ``GATEWAY_MAX_N`` sets the served one (at most this)."""


@dataclass(frozen=True)
class Bounds:
    """The accepted range of a numeric setting: from ``low`` to ``high`` (None: no upper bound),
    each end closed unless marked open. Integer settings carry integer bounds."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False


@dataclass(frozen=True)
class SettingSpec:
    """One environment variable: its name, default (None: optional, unset), meaning and, for a
    number, its accepted range (the gateway's loader checks it and names it in its errors)."""

    env: str
    default: str | None
    help: str
    bounds: Bounds | None = None


GATEWAY_SETTINGS: tuple[SettingSpec, ...] = (
    # --- where the model is and what it is called ----------------------------------------------
    SettingSpec(GATEWAY_ENGINE, "vllm",
                "Engine to run when `serve` gets no --engine: vllm (the test side adds sim)."),
    SettingSpec(GATEWAY_MODEL_DIR, "/opt/ml/model",
                "Model directory: tokenizer.json, tokenizer_config.json (chat template), weights."),
    SettingSpec(GATEWAY_SERVED_MODEL_NAME, "mangaassist-base",
                "Name of the base model in `model` and in responses."),
    SettingSpec(GATEWAY_ADAPTERS_DIR, None,
                "One sub-directory per LoRA adapter (default: MODEL_DIR/adapters)."),
    SettingSpec(GATEWAY_ADAPTERS, "manga=manga_domain,support=general_support,"
                "manga-ja=jp_translation",
                "Served adapter name = sub-directory of the adapters directory, comma-separated."),
    SettingSpec(GATEWAY_ROUTING_TABLE,
                "product_question=manga,recommendation=manga,discovery=manga,"
                "order_tracking=support,return_request=support,escalation=support,"
                "chitchat=base,faq=base",
                "intent=adapter (or `base`) when `model` is absent or `auto`; unlisted intents "
                "use the base model."),
    SettingSpec(GATEWAY_LOCALE_ROUTES, "ja-JP:manga=manga-ja",
                "locale:adapter=replacement[,adapter=replacement][;locale:...], applied after "
                "the routing table."),
    # --- context budget ---------------------------------------------------------------------------
    SettingSpec(GATEWAY_CONTEXT_SPLIT, format_context_split(DEFAULT_CONTEXT_SPLIT),
                "Shares of ENGINE_MAX_MODEL_LEN for system+pinned messages, RAG context, history "
                "and the default max output (512/1024/2048/512 of 4096, "
                "docs/design-decisions.md#context-split)."),
    SettingSpec(GATEWAY_CONTEXT_STEP_TURNS, "6",
                "When the history outgrows its share, the window drops the oldest turns in one "
                "step so that this many more turns of the conversation's average size fit "
                "before the next step: between steps every prompt extends the previous one and "
                "the engine's prefix cache serves it (docs/design-decisions.md"
                "#prefix-stable-window).",
                bounds=Bounds(1, 1000)),
    SettingSpec(GATEWAY_TOKEN_CACHE_MAX_TOKENS, "2000000",
                "Bound of the per-message token cache, in cached tokens (LRU).",
                bounds=Bounds(0)),
    SettingSpec(GATEWAY_MAX_MESSAGES, "512", "Most messages one request may carry.",
                bounds=Bounds(1, 100_000)),
    SettingSpec(GATEWAY_MAX_N, "4",
                "Most choices (`n`) one request may ask for; each is one of the engine's "
                "running sequences and holds its own answer's KV.",
                bounds=Bounds(1, MAX_N_SCHEMA)),
    SettingSpec(GATEWAY_MAX_BODY_BYTES, "1048576", "Largest request body accepted (413 above).",
                bounds=Bounds(1024)),
    # --- admission --------------------------------------------------------------------------------
    SettingSpec(GATEWAY_ADMISSION_WATERMARK, "0.9",
                "The most of the engine's KV blocks one request may be expected to hold at its "
                "end (prompt + expected answers), (0, 1]; more never fits. Dispatch itself "
                "follows vLLM's rule on the whole pool.",
                bounds=Bounds(0.0, 1.0, low_open=True)),
    SettingSpec(GATEWAY_TTFT_SLO_S, "2.0",
                "The time-to-first-token SLO admission serves within: the prefill valve refuses "
                "at once, with 429 and a Retry-After, a request that would wait behind more "
                "prompt tokens than the engine drains in half of it "
                "(docs/design-decisions.md#surge-admission).",
                bounds=Bounds(0.05, 59.0)),
    SettingSpec(GATEWAY_ADMISSION_WAIT_S, "10",
                "Safety net: an admitted request still queued after this long (the engine slowed "
                "down sharply) gets 429 instead of waiting on.",
                bounds=Bounds(0.0, 59.0)),
    SettingSpec(GATEWAY_RETRY_AFTER_S, "2", "Retry-After (seconds) on 429/503 answers.",
                bounds=Bounds(1, 3600)),
    SettingSpec(GATEWAY_BUCKET_CAPS, format_bucket_caps(DEFAULT_BUCKET_CAPS),
                "Concurrent requests allowed per bucket; the buckets (prompt + max output "
                "tokens) are S <= 1/8, M <= 1/4, L <= 1/2 of ENGINE_MAX_MODEL_LEN, XL above."),
    SettingSpec(GATEWAY_SESSION_TTL_S, "1200",
                "Lifetime of a SageMaker stateful session this instance opens (its Expires), "
                "from its creation; a conversation that lasts longer opens another "
                "(docs/design-decisions.md#session-affinity).",
                bounds=Bounds(60.0, 86400.0)),
    SettingSpec(GATEWAY_SESSION_MAX, "100000",
                "Most open sessions one instance remembers (the oldest is forgotten first).",
                bounds=Bounds(1, 10_000_000)),
    SettingSpec(GATEWAY_REQUEST_DEADLINE_S, "50",
                "Whole-request deadline; must stay below SageMaker's 60 s invoke limit.",
                bounds=Bounds(1.0, SAGEMAKER_INVOKE_TIMEOUT_S, high_open=True)),
    # --- circuit breaker and recovery ------------------------------------------------------------
    SettingSpec(GATEWAY_BREAKER_OPEN_S, "30", "How long the breaker stays open after a trip.",
                bounds=Bounds(0.0, 3600.0)),
    SettingSpec(GATEWAY_BREAKER_CLOSE_AFTER_SUCCESSES, "20",
                "Successful requests in half-open that close the breaker.",
                bounds=Bounds(1)),
    SettingSpec(GATEWAY_BREAKER_HALF_OPEN_MAX_INFLIGHT, "4",
                "Concurrent requests allowed while half-open (the probes).",
                bounds=Bounds(1)),
    SettingSpec(GATEWAY_BREAKER_CONTEXT_FACTOR, "0.5",
                "Multiplier of the history and RAG budgets while the breaker is not closed.",
                bounds=Bounds(0.0, 1.0, low_open=True)),
    SettingSpec(GATEWAY_ENGINE_RESTART_MAX_ATTEMPTS, "5",
                "Attempts to rebuild a dead engine before giving up (/ping turns red).",
                bounds=Bounds(1)),
    SettingSpec(GATEWAY_ENGINE_RESTART_BACKOFF_S, "1.0",
                "Wait before rebuild attempt n is BACKOFF_S x 2^(n-1).",
                bounds=Bounds(0.0, 600.0)),
    SettingSpec(GATEWAY_ENGINE_RESTART_BACKOFF_MAX_S, "30", "Longest wait between attempts.",
                bounds=Bounds(0.0, 3600.0)),
    SettingSpec(GATEWAY_CRASH_LOOP_DEATHS, "3",
                "Engine deaths within the window that make a crash loop (/ping red).",
                bounds=Bounds(1)),
    SettingSpec(GATEWAY_CRASH_LOOP_WINDOW_S, "600", "Crash-loop window.",
                bounds=Bounds(0.0, 86400.0, low_open=True)),
    SettingSpec(GATEWAY_RECOVERY_GRACE_S, "120",
                "/ping stays 200 this long while a dead engine is being rebuilt.",
                bounds=Bounds(0.0, 3600.0, low_open=True)),
    SettingSpec(GATEWAY_EXPECTED_KV_TOKENS, None,
                "KV pool the GPU budget planned; the engine's real pool is compared with it at "
                "start (a warning beyond 10 %); admission always uses the engine's figure.",
                bounds=Bounds(1)),
    SettingSpec(GATEWAY_WARMUP_TIMEOUT_S, "600",
                "Warmup must succeed within this long after the engine is ready, else /ping "
                "turns red (failed) and SageMaker replaces the instance.",
                bounds=Bounds(1.0, 3600.0)),
    SettingSpec(GATEWAY_DRAIN_TIMEOUT_S, "25",
                "On SIGTERM, how long in-flight requests may finish (SageMaker kills at 30 s).",
                bounds=Bounds(0.0, SAGEMAKER_SIGKILL_AFTER_S, high_open=True)),
    SettingSpec(GATEWAY_START_CACHE, None,
                "The GPU start cache (Triton's and vLLM's compile caches, "
                "docs/develop.md#the-start-cache): an absolute directory holding start-cache.json "
                "and start-cache.tar.gz, or off; unset: GATEWAY_MODEL_DIR/start-cache when it "
                "exists. Checked against this GPU, the library versions and the engine arguments; "
                "a stale or foreign cache is refused and the start goes on without it."),
    # --- metrics and test mode -------------------------------------------------------------------
    SettingSpec(GATEWAY_METRICS_ENDPOINT_NAME, "local", "EMF dimension EndpointName."),
    SettingSpec(GATEWAY_METRICS_VARIANT_NAME, "AllTraffic", "EMF dimension VariantName."),
    SettingSpec(GATEWAY_METRICS_INTERVAL_S, "10",
                "Period of the KV-usage / queue / breaker-state gauge line.",
                bounds=Bounds(0.1, 3600.0)),
    SettingSpec(GATEWAY_TEST_MODE, "false",
                "true enables /admin/* (OOM injection). Never set in production."),
)
"""Every ``GATEWAY_*`` variable, once (the engine's ``ENGINE_*`` rows follow from the GPU
budget's table; the gateway appends them)."""

GATEWAY_SETTING: Mapping[str, SettingSpec] = {spec.env: spec for spec in GATEWAY_SETTINGS}
"""A ``GATEWAY_*`` variable's spec by name (its default and bounds)."""
