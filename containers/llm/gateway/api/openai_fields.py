"""Every Chat Completions request field, OpenAI's and vLLM's: accepted by this gateway, or refused
and why. One table, read by the request schema's error messages, the docs' compatibility table
and the tests that hold the schema, OpenAI's client types and vLLM's own request class to it.

The gateway's schema (:class:`gateway.api.protocol.ChatCompletionRequest`) is the public contract.
Its accepted sampling fields reach vLLM through vLLM's own ``ChatCompletionRequest`` and
``to_sampling_params`` (:mod:`gateway.engines.vllm`), so their meaning is vLLM's. A refused field
is named in a 400 with the reason below, never silently ignored. Why some are refused: the
gateway renders and counts every prompt itself (the context budget must see exactly what the
engine sees), orders requests itself (admission), and serves a text-only model, whose quality
gate scores chat answers only, to callers — the MangaAssist orchestrator — that call the shop's
functions themselves.

Pure module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Origin = Literal["OpenAI", "vLLM", "both"]
Status = Literal["accepted", "refused"]


@dataclass(frozen=True)
class FieldSupport:
    """One request field: where it comes from, whether this gateway takes it, and why."""

    name: str
    origin: Origin
    status: Status
    note: str


_RENDERED_HERE = ("the gateway renders and counts every prompt itself (the context budget must "
                  "see exactly the tokens the engine gets)")
_TOOLS = ("tool calls are not served: the MangaAssist orchestrator calls the shop's functions "
          "itself and passes their results as messages or mangaassist.rag_context, and the "
          "quantization gate scores chat answers (the AWQ base's, and each adapter's on the AWQ "
          "base), never a tool call")
_TEXT_ONLY = "the served model reads and writes text only"
_PLATFORM = "an OpenAI platform feature with no counterpart on a self-hosted engine"
_ENGINE_INTERNAL = "an engine-side control the gateway does not expose to callers"
_NOT_NEEDED = "a vLLM extension no MangaAssist caller or benchmark client uses; not exposed"
_TOOL_FIELDS: tuple[tuple[str, Origin], ...] = (
    ("tools", "both"), ("tool_choice", "both"), ("parallel_tool_calls", "both"),
    ("functions", "OpenAI"), ("function_call", "OpenAI"))

FIELDS: tuple[FieldSupport, ...] = (
    # --- accepted -----------------------------------------------------------------------------
    FieldSupport("messages", "both", "accepted",
                 "content as a string or a list of `text` parts (joined with a newline, as "
                 "vLLM's server does for this chat template); other part types are refused "
                 "naming the part"),
    FieldSupport("model", "both", "accepted",
                 "the base model's name, a served LoRA adapter, or `auto` (route by intent)"),
    FieldSupport("max_tokens", "both", "accepted",
                 "at most the window less the prompt; default: the window's output share"),
    FieldSupport("max_completion_tokens", "both", "accepted", "the same as max_tokens"),
    FieldSupport("temperature", "both", "accepted", "default: the model's generation config"),
    FieldSupport("top_p", "both", "accepted", "default: the model's generation config"),
    FieldSupport("top_k", "vLLM", "accepted", "vLLM's sampling extension"),
    FieldSupport("min_p", "vLLM", "accepted", "vLLM's sampling extension"),
    FieldSupport("presence_penalty", "both", "accepted", ""),
    FieldSupport("frequency_penalty", "both", "accepted", ""),
    FieldSupport("repetition_penalty", "vLLM", "accepted", "vLLM's sampling extension"),
    FieldSupport("seed", "both", "accepted", ""),
    FieldSupport("stop", "both", "accepted", "up to 4 strings"),
    FieldSupport("n", "both", "accepted",
                 "up to GATEWAY_MAX_N choices (and ENGINE_MAX_NUM_SEQS); each is one of the "
                 "engine's running sequences; above 1 needs a temperature above 0 (vLLM's rule "
                 "for greedy sampling)"),
    FieldSupport("logprobs", "both", "accepted", "the sampled tokens' log-probabilities"),
    FieldSupport("top_logprobs", "both", "accepted", "0-20 alternatives per token (needs "
                 "logprobs)"),
    FieldSupport("min_tokens", "vLLM", "accepted", "vLLM's sampling extension"),
    FieldSupport("ignore_eos", "vLLM", "accepted",
                 "vLLM's sampling extension (benchmark clients send it)"),
    FieldSupport("response_format", "both", "accepted",
                 "`text`, `json_object` or `json_schema`, through vLLM's structured outputs "
                 "(the output is constrained; no prompt tokens are added); a schema the engine "
                 "cannot compile is a 400"),
    FieldSupport("stream", "both", "accepted", "Server-Sent Events"),
    FieldSupport("stream_options", "both", "accepted", "`include_usage`"),
    FieldSupport("user", "both", "accepted",
                 "accepted and ignored: neither logged nor passed to the engine"),
    FieldSupport("mangaassist", "both", "accepted",
                 "MangaAssist's own fields: intent, locale, pinned_messages, rag_context"),
    # --- refused: tools and multimodal ---------------------------------------------------------
    *(FieldSupport(name, origin, "refused", _TOOLS) for name, origin in _TOOL_FIELDS),
    FieldSupport("audio", "OpenAI", "refused", _TEXT_ONLY),
    FieldSupport("modalities", "OpenAI", "refused", _TEXT_ONLY),
    FieldSupport("prediction", "OpenAI", "refused",
                 "predicted outputs are not offered by the engine"),
    # --- refused: OpenAI platform features ------------------------------------------------------
    *(FieldSupport(name, "OpenAI", "refused", _PLATFORM) for name in (
        "store", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention",
        "prompt_cache_options", "safety_identifier", "web_search_options", "moderation",
        "verbosity")),
    FieldSupport("reasoning_effort", "both", "refused",
                 "Llama-3-8B-Instruct is not a reasoning model"),
    FieldSupport("logit_bias", "both", "refused",
                 "token-id biases are specific to one tokenizer; the quantization gate scores "
                 "the base's and each adapter's answers without them"),
    # --- refused: the gateway owns the prompt -----------------------------------------------
    *(FieldSupport(name, "vLLM", "refused", _RENDERED_HERE) for name in (
        "echo", "add_generation_prompt", "continue_final_message", "add_special_tokens",
        "chat_template", "chat_template_kwargs", "documents", "truncate_prompt_tokens",
        "truncation_side")),
    FieldSupport("priority", "vLLM", "refused",
                 "the gateway's admission orders requests (first come, first served within "
                 "the TTFT SLO)"),
    FieldSupport("request_id", "vLLM", "refused", "the gateway names every request itself"),
    FieldSupport("session_id", "vLLM", "refused",
                 "SageMaker sessions use the X-Amzn-SageMaker-Session-Id header instead"),
    FieldSupport("prompt_logprobs", "vLLM", "refused",
                 "log-probabilities of the whole prompt cost a full prefill pass per request"),
    FieldSupport("use_beam_search", "vLLM", "refused",
                 "beam search is outside the latency SLOs this endpoint is sized for"),
    FieldSupport("length_penalty", "vLLM", "refused", "applies to beam search only"),
    *(FieldSupport(name, "vLLM", "refused", _NOT_NEEDED) for name in (
        "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens", "allowed_token_ids", "bad_words", "logprob_token_ids",
        "structured_outputs", "watermarking", "repetition_detection", "thinking_token_budget",
        "include_reasoning", "stream_interval", "return_tokens_as_token_ids",
        "return_token_ids", "return_token_offsets", "return_prompt_text")),
    *(FieldSupport(name, "vLLM", "refused", _TEXT_ONLY) for name in (
        "mm_processor_kwargs", "media_io_kwargs", "mm_payload", "return_mm_kwargs")),
    *(FieldSupport(name, "vLLM", "refused", _ENGINE_INTERNAL) for name in (
        "cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs",
        "routed_experts_prompt_start", "return_weight_versions")),
)
"""Every field, accepted first."""

BY_NAME: Mapping[str, FieldSupport] = {field.name: field for field in FIELDS}
ACCEPTED: frozenset[str] = frozenset(f.name for f in FIELDS if f.status == "accepted")
REFUSED: Mapping[str, str] = {f.name: f.note for f in FIELDS if f.status == "refused"}

SAMPLING_FIELDS: tuple[str, ...] = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "n", "logprobs", "top_logprobs", "min_tokens",
    "ignore_eos", "response_format",
)
"""The accepted fields that become sampling parameters (handed to the engine as sent; the
gateway sets ``max_tokens`` itself, from its window)."""


def refusal(name: str) -> str | None:
    """Why ``name`` is refused, or None when it is accepted or unknown."""
    return REFUSED.get(name)


def compatibility_markdown() -> str:
    """The compatibility table docs/gateway.md shows (a test keeps them equal)."""
    lines = ["| field | from | this gateway | notes |", "|---|---|---|---|"]
    for field in FIELDS:
        note = field.note.replace("|", "\\|")
        lines.append(f"| `{field.name}` | {field.origin} | {field.status} | {note} |")
    return "\n".join(lines)
