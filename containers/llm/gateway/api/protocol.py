"""The HTTP contract: OpenAI Chat Completions request/response shapes plus our extension.

Requests follow OpenAI's Chat Completions schema closely enough that the official ``openai``
client (and vLLM's benchmark client) works unchanged: content as a string or text parts,
``response_format``, ``logprobs``, ``n`` and vLLM's sampling extensions; the fields this gateway
does not serve (tools, multimodal parts, prompt-rendering controls ...) are refused by name, with
the reason :mod:`gateway.api.openai_fields` gives, rather than ignored. MangaAssist's own request
fields live in one namespace, the ``mangaassist`` object (the openai client sends it with
``extra_body={"mangaassist": {...}}``); responses carry a ``mangaassist`` object too: which adapter
answered, what the context budget kept and dropped, whether the answer is a fallback.

Validation is strict (no "5" for 5, no 1 for true; 5.0 is 5, as JSON Schema reads it), and an
unknown key is refused at every level. Pure module (pydantic only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from gateway.api.errors import shown
from gateway.api.openai_fields import SAMPLING_FIELDS, refusal
from intents import INTENT_LABELS, require_intent
from request_buckets import BucketName
from serving_contract import LOCALE_PATTERN
from serving_contract.environment import MAX_N_SCHEMA


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (not valid Unicode text)") from None
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]


def _integral(value: Any) -> Any:
    """JSON has one number type and JSON Schema's ``integer`` is any number without a fraction,
    so ``5.0`` is the integer 5 (``5.5``, ``"5"`` and ``true`` are still refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WHOLE = BeforeValidator(_integral)
"""On every integer field, after its bounds (``Annotated[int, Field(ge=...), WHOLE]``: bounds
placed before the conversion appear in the JSON schema as ``minimum`` / ``maximum``): strict, but
a whole number written as ``5.0`` is 5."""


MAX_STOPS = 4
STOP_CHARS = 64


def _stop_sequence(item: Any, where: str) -> None:
    if not isinstance(item, str):
        raise PydanticCustomError("invalid_type", f"{where}a stop sequence is a string")
    if not 1 <= len(item) <= STOP_CHARS:
        raise ValueError(f"{where}a stop sequence has 1 to {STOP_CHARS} characters, "
                         f"got {len(item)}")
    try:
        _valid_unicode(item)
    except ValueError as error:
        raise ValueError(f"{where}{error}") from None


def _valid_stop(value: Any) -> Any:
    """``stop``: a string or a list of at most four, each 1-64 characters of valid Unicode (vLLM
    refuses an empty one); the message names the element (``stop[2]``)."""
    if value is None or isinstance(value, str):
        if value is not None:
            _stop_sequence(value, "")
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("invalid_type", "should be a string, a list of strings or null")
    if len(value) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop sequences, got {len(value)}")
    for index, item in enumerate(value):
        _stop_sequence(item, f"[{index}]: ")
    return value


StopSequence = Annotated[Text, Field(min_length=1, max_length=STOP_CHARS)]


TEXT_PART_SEPARATOR = "\n"
"""How text parts join into one content string: as vLLM's server joins them for chat templates
that take a string (Llama-3's), so both render the same prompt."""


class TextContentPart(BaseModel):
    """One part of a message's content: text (the only kind a text model takes)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]
    text: Text


def _text_parts_only(value: Any) -> Any:
    """Name the first part that is not text, with what is accepted (a 400 naming the part)."""
    if isinstance(value, list):
        for index, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(part, dict) and kind != "text":
                raise PydanticCustomError(
                    "unsupported_value", f"[{index}].type: {shown(kind)} parts are not accepted: "
                    "the served model reads text only; accepted part type: 'text'")
    return value


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "string"
    return "parts" if isinstance(value, list) else None


MessageContent = Annotated[
    Annotated[Text, Tag("string")] | Annotated[list[TextContentPart], Tag("parts")],
    Discriminator(_content_kind, custom_error_type="content_type",
                  custom_error_message="Input should be a string or a list of text parts"),
    BeforeValidator(_text_parts_only),
]
CONTENT_TAGS: frozenset[str] = frozenset({"string", "parts"})
"""The content union's tags, which pydantic puts into an error's location."""


_TOOL_REFUSAL = refusal("tools")
TOOL_ROLES: frozenset[str] = frozenset({"tool", "function"})
"""Message roles of tool calling: refused with the ``tools`` row's reason."""


def _no_tool_role(value: Any) -> Any:
    """A tool-calling role is refused with its reason; any other value (an object or a list
    included: JSON's types, not only strings) is left to the role's own type check."""
    if isinstance(value, str) and value in TOOL_ROLES:
        raise PydanticCustomError(
            "unsupported_value", f"{value!r} messages are not accepted by this gateway: "
                                 f"{_TOOL_REFUSAL}")
    return value


def _empty_only(refused: str) -> Callable[[Any], None]:
    """A message field accepted only empty (absent, null or ``[]``, as the OpenAI SDK echoes an
    answer's message back), refused by name with the sentence ``refused`` otherwise."""

    def check(value: Any) -> None:
        if value is None or value == []:
            return None
        raise PydanticCustomError("unsupported_parameter", refused)

    return check


_EMPTY = WithJsonSchema({"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]})
"""What those fields' JSON schema says they take: null or an empty list."""
ToolCallingField = Annotated[None, BeforeValidator(_empty_only(
    f"not accepted by this gateway: {_TOOL_REFUSAL}")), _EMPTY]
EchoedField = Annotated[None, BeforeValidator(_empty_only(
    "only null (or an empty list) is accepted: an answer's refusal, audio or annotations are not "
    "part of the prompt (send the text as content)")), _EMPTY]


class ChatMessage(BaseModel):
    """One message: content is a string or a list of text parts (other parts are refused).

    Tool calling is refused as the request's ``tools`` are: a ``tool`` (or ``function``) message,
    an assistant's ``tool_calls`` (or ``function_call``), a ``tool_call_id`` — each a 400 naming
    it, never dropped. (Declared before ``content``, whose absence in a tool call's message
    would otherwise be the error named.)"""

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Annotated[Literal["system", "developer", "user", "assistant"],
                    BeforeValidator(_no_tool_role)]
    tool_calls: ToolCallingField = Field(None, description="Refused: " + str(_TOOL_REFUSAL))
    function_call: ToolCallingField = Field(None, description="Refused: " + str(_TOOL_REFUSAL))
    tool_call_id: ToolCallingField = Field(None, description="Refused: " + str(_TOOL_REFUSAL))
    content: MessageContent
    name: Annotated[Text, Field(max_length=64)] | None = None
    refusal: EchoedField = Field(None, description="Accepted null or empty only (the openai SDK "
                                                   "echoes an answer's message with it).")
    audio: EchoedField = Field(None, description="Accepted null or empty only.")
    annotations: EchoedField = Field(None, description="Accepted null or empty only.")

    @property
    def text(self) -> str:
        """The content as one string (text parts joined as vLLM's server joins them)."""
        if isinstance(self.content, str):
            return self.content
        return TEXT_PART_SEPARATOR.join(part.text for part in self.content)


class StreamOptions(BaseModel):
    """OpenAI's stream_options: include_usage adds a final chunk with token usage."""

    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool = False


class ResponseFormatText(BaseModel):
    """Plain text (the default)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]


class ResponseFormatJsonObject(BaseModel):
    """Any JSON object (vLLM's structured outputs constrain the answer to one)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["json_object"]


MAX_SCHEMA_DEPTH = 64
"""The deepest nesting of objects and arrays a ``json_schema`` may have (a real schema nests a
few levels per property level; the answer's serialization stops near 200)."""


def nesting_depth(value: Any, *, limit: int) -> int:
    """How deeply ``value``'s objects and arrays nest (1 for a flat one), counted without
    recursion and no further than ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _shallow_schema(value: dict[str, Any]) -> dict[str, Any]:
    if nesting_depth(value, limit=MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"nests objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep")
    return value


class JsonSchemaSpec(BaseModel):
    """OpenAI's ``json_schema`` object: the schema the answer must follow."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    name: Annotated[Text, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Text | None = None
    json_schema: Annotated[dict[str, Any], AfterValidator(_shallow_schema)] = Field(
        alias="schema", description=f"At most {MAX_SCHEMA_DEPTH} levels of nesting.")
    strict: bool | None = None


class ResponseFormatJsonSchema(BaseModel):
    """An answer that follows a JSON schema (vLLM's structured outputs)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
    Discriminator("type"),
]
UNION_TAGS: dict[str, frozenset[str]] = {
    "content": CONTENT_TAGS,
    "response_format": frozenset({"text", "json_object", "json_schema"}),
}
"""Tagged-union fields and their tags, which pydantic puts into an error's location after the
field's name (the HTTP edge leaves them out of the ``param`` it names)."""


class MangaAssistExtension(BaseModel):
    """MangaAssist's request fields (all optional)."""

    model_config = ConfigDict(strict=True, extra="forbid", title="MangaAssistRequestExtension")

    intent: Annotated[
        str | None,
        WithJsonSchema({"anyOf": [{"type": "string", "enum": list(INTENT_LABELS)},
                                  {"type": "null"}]}),
    ] = Field(None, description="The router's intent; picks the adapter when model is "
                                "absent or 'auto'.")
    locale: Annotated[str, Field(pattern=LOCALE_PATTERN.pattern, max_length=35)] | None = Field(
        None, description="BCP-47 locale of the customer, e.g. ja-JP.")
    pinned_messages: list[Annotated[int, Field(ge=0), WHOLE]] = Field(
        default_factory=list, max_length=64,
        description="Indices into messages that the sliding window must keep (stated "
                    "preferences).")
    rag_context: list[Text] = Field(
        default_factory=list, max_length=32,
        description="Retrieved passages, best first; trimmed (lowest-ranked first) to the RAG "
                    "budget.")

    @field_validator("intent")
    @classmethod
    def _known_intent(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return require_intent(value, field="mangaassist.intent")


class ChatCompletionRequest(BaseModel):
    """POST /invocations and /v1/chat/completions body."""

    model_config = ConfigDict(strict=True, extra="forbid", title="ChatCompletionRequest")

    messages: list[ChatMessage] = Field(min_length=1)
    model: Annotated[Text, Field(max_length=256)] | None = Field(
        None, description="A served adapter, the base model's name, or 'auto' (route by intent).")
    max_tokens: Annotated[int, Field(ge=1), WHOLE] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1), WHOLE] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: Annotated[StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOPS)]
                    | None, BeforeValidator(_valid_stop)] = Field(
        None, description=f"Up to {MAX_STOPS} sequences of 1-{STOP_CHARS} characters.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N_SCHEMA), WHOLE] | None = Field(
        None, description="Choices to generate (at most GATEWAY_MAX_N and ENGINE_MAX_NUM_SEQS).")
    seed: Annotated[int, Field(ge=0, le=2**63 - 1), WHOLE] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0,
                                             description="vLLM's sampling extension.")
    top_k: Annotated[int, Field(ge=-1, le=100_000), WHOLE] | None = Field(
        None, description="vLLM's sampling extension (-1 or 0: off).")
    min_p: float | None = Field(None, ge=0.0, le=1.0,
                                description="vLLM's sampling extension.")
    min_tokens: Annotated[int, Field(ge=0), WHOLE] | None = Field(
        None, description="vLLM's sampling extension: at most max_tokens (vLLM's rule); "
                                "without max_tokens the output limit rises to it.")
    ignore_eos: bool | None = Field(None, description="vLLM's sampling extension.")
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), WHOLE] | None = Field(
        None, description="Needs logprobs: true when above 0.")
    response_format: ResponseFormat | None = None
    user: Annotated[Text, Field(max_length=256)] | None = None
    mangaassist: MangaAssistExtension | None = None

    @field_validator("min_tokens")
    @classmethod
    def _min_tokens_within_max(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = info.data.get("max_completion_tokens") or info.data.get("max_tokens")
        if value is not None and limit is not None and value > limit:
            raise ValueError(f"min_tokens={value} is above the output limit {limit} "
                             "(max_tokens / max_completion_tokens); vLLM's SamplingParams "
                             "refuses min_tokens > max_tokens")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def sampling_fields(self) -> dict[str, Any]:
        """The sampling fields the caller set, as sent (JSON), for the engine to interpret:
        :data:`gateway.api.openai_fields.SAMPLING_FIELDS` (``max_tokens`` is the gateway's)."""
        sent = self.model_dump(mode="json", include=set(SAMPLING_FIELDS), exclude_none=True,
                               by_alias=True)
        return {name: sent[name] for name in SAMPLING_FIELDS if name in sent}


class SessionRequest(BaseModel):
    """POST /invocations body that opens or closes a SageMaker stateful session (gateway.sessions):
    ``NEW_SESSION`` (with ``InvokeEndpoint(SessionId="NEW_SESSION")``), or ``CLOSE`` (with the
    session's id as ``SessionId``)."""

    model_config = ConfigDict(strict=True, extra="forbid", title="SessionRequest")

    requestType: Literal["NEW_SESSION", "CLOSE"]


def _invocation_kind(body: Any) -> str:
    """A body with ``requestType`` manages a session; anything else is a chat request."""
    return "session" if isinstance(body, dict) and "requestType" in body else "chat"


InvocationBody = Annotated[
    Annotated[ChatCompletionRequest, Tag("chat")] | Annotated[SessionRequest, Tag("session")],
    Discriminator(_invocation_kind),
]
"""What POST /invocations accepts: a chat completion request or a session request."""
INVOCATION_TAGS: frozenset[str] = frozenset({"chat", "session"})
"""The discriminator's tags, which pydantic puts into an error's location."""


# --- responses (gateway.api.responses builds every answer from these) ---
class ErrorDetail(BaseModel):
    """OpenAI's error object: ``param`` the field's public path (or null), ``code`` never null."""

    message: str
    type: str
    param: str | None
    code: str


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body."""

    error: ErrorDetail


class AssistantMessage(BaseModel):
    """The answer."""

    role: Literal["assistant"]
    content: str
    refusal: None = None


class TopLogprob(BaseModel):
    """One alternative at a position (OpenAI's ``top_logprobs`` entry)."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(BaseModel):
    """One generated token's log-probability and the most likely alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    """OpenAI's ``choices[].logprobs``."""

    content: list[TokenLogprob] | None


class Choice(BaseModel):
    """One choice (``n`` of them)."""

    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"]


class PromptTokensDetails(BaseModel):
    """OpenAI's breakdown of the prompt tokens."""

    cached_tokens: int
    """Prompt tokens the engine's prefix cache served (vLLM's ``num_cached_tokens``)."""


class Usage(BaseModel):
    """Token usage in the served model's tokens."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ContextReport(BaseModel):
    """What the sliding window kept and dropped."""

    prompt_tokens: int
    prompt_budget_tokens: int
    history_budget_tokens: int
    max_output_tokens: int
    template_overhead_tokens: int
    kept_messages: list[int]
    dropped_messages: list[int]
    dropped_turns: int
    truncated: bool
    truncation_notice: str | None
    rag_chunks_kept: int
    rag_chunks_dropped: int
    context_factor: float


class FallbackInfo(BaseModel):
    """Why this answer is a fallback rather than generated."""

    reason: Literal["engine_out_of_memory", "engine_dead", "engine_error", "breaker_open_xl"]
    detail: str


class SessionReport(BaseModel):
    """The SageMaker session the request named (present only when it named one)."""

    id: str
    state: Literal["opened", "active", "expired", "unknown"]
    """``expired`` / ``unknown``: this instance did not hold it; served as usual (a session is a
    routing hint, never state)."""


class ResponseExtension(BaseModel):
    """MangaAssist's response fields."""

    model_config = ConfigDict(title="MangaAssistResponseExtension")

    adapter: str | None
    route: str
    bucket: BucketName
    breaker: Literal["closed", "half_open", "open"]
    fallback: FallbackInfo | None
    deadline_exceeded: bool
    context: ContextReport
    session: SessionReport | None = Field(None, exclude_if=lambda value: value is None)


class SessionOpened(BaseModel):
    """The answer to ``{"requestType": "NEW_SESSION"}`` (the id is also in the header)."""

    session_id: str
    expires_at: str


class SessionClosed(BaseModel):
    """The answer to ``{"requestType": "CLOSE"}``."""

    session_id: str
    was_open: bool
    """False when this instance did not hold the session (closing is idempotent)."""


class ChatCompletionResponse(BaseModel):
    """Non-streaming answer (OpenAI's chat.completion)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None
    mangaassist: ResponseExtension


class ModelCard(BaseModel):
    """One entry of GET /v1/models."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    """GET /v1/models."""

    object: Literal["list"]
    data: list[ModelCard]


class PromptRenderingStatus(BaseModel):
    """How prompts are rendered, and whether that was checked against the engine's tokenizer."""

    mode: Literal["assembled", "whole_text", "engine_tokenizer"]
    verified: bool
    detail: str


class PingResponse(BaseModel):
    """GET /ping body (200 or 503)."""

    status: Literal["healthy", "recovering", "warming_up", "recovery_overdue", "crash_loop",
                    "failed", "draining"]
    reason: str
    engine: str
    breaker: Literal["closed", "half_open", "open"]
    engine_generation: int
    engine_restarts: int
    warmup: str
    adapters: dict[str, str]
    """Each LoRA adapter: "loaded", "failed: <reason>", "not loaded" or "configured"."""
    prompt_rendering: PromptRenderingStatus
    start_cache: str = "none"
    """The GPU start cache: "used", "refused: <reason>" or "none" (docs/gateway.md#cold-start)."""


class ChunkDelta(BaseModel):
    """What a stream chunk adds: the role once, then content; absent fields are left out."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _present_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChunkChoice(BaseModel):
    """One choice's part of a stream chunk."""

    index: int
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionChunk(BaseModel):
    """One Server-Sent Event of a streamed answer (OpenAI's chat.completion.chunk).

    ``mangaassist`` rides on the first chunk (the route and the context report) and on the last
    one with a finish_reason (adding ``fallback``); the optional usage chunk has no choices.
    """

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None
    mangaassist: ResponseExtension | None = None

    @model_serializer(mode="wrap")
    def _optional_parts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        document: dict[str, Any] = handler(self)
        for key in ("usage", "mangaassist"):
            if document[key] is None:
                del document[key]
        return document


STREAM_DESCRIPTION = (
    "Server-Sent Events when stream is true: `data: {chat.completion.chunk}` lines, the first "
    "with the assistant role and the mangaassist object, the last with finish_reason (and "
    "mangaassist.fallback when the answer is a fallback), optionally a usage chunk, then "
    "`data: [DONE]`."
)
