"""The served model's tokenizer and chat template, with a bounded per-message token cache.

Token counts must be in the served model's own vocabulary (never tiktoken: wrong vocabulary, and
it downloads at first use). The tokenizer comes from the model directory: ``tokenizer.json``
(HF ``tokenizers``) and the chat template from ``chat_template.jinja`` or the ``chat_template``
key of ``tokenizer_config.json``, rendered in a sandboxed Jinja environment the way transformers
renders it.

:meth:`ChatTokenizer.render_prompt` is the one function that turns messages into the prompt the
engine receives (text and token ids); the vLLM adapter may later swap in the engine's own
tokenizer behind it.

Speed. Tokenizing a whole 30-turn prompt costs milliseconds, more than the rest of the gateway.
So each message's token ids are cached by content (LRU, bounded in cached tokens) and a prompt is
assembled as: template rendered with placeholders → literal segments (cached ids) interleaved
with the cached ids of each message. That equals tokenizing the rendered text exactly when the
template separates message contents by token boundaries (special tokens, newlines), as
Llama-3's does. This is *verified at load time* on probe conversations against full
tokenization; if any probe differs, every prompt is tokenized whole instead (slower, still exact).
"""

from __future__ import annotations

import json
import re
import time
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from gateway.engines.base import ChatRenderer, RenderedPrompt

FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] | trim + '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
"""Used only when the model directory has no chat template (logged at start)."""

_PLACEHOLDER = re.compile("\ue000(\\d+)\ue001")
_PROBE_CONTENTS = (
    "What manga series are similar to Naruto?",
    "鬼滅の刃に似たマンガを5つ教えてください。",
    "34 volumes, 7 colossal editions.",
    "¿Qué? 'single quotes' and \"double\" — dashes…",
    "ワンピース 1巻 (English) and 2巻!",
    "x",
    "🙂 emoji first, then text",
    "'s apostrophe first",
    "line one\nline two\n\nline four",
)


class ModelDirError(ValueError):
    """The model directory lacks a usable tokenizer; the message names the path and the file."""


class ChatTemplateError(ValueError):
    """The model's chat template rejected the conversation (e.g. roles must alternate)."""


class ChatTurn(NamedTuple):
    """One message as the template sees it."""

    role: str
    content: str


@dataclass(frozen=True)
class TemplateOverhead:
    """Tokens the chat template adds: once per prompt, and per message by role."""

    fixed_tokens: int
    per_message_tokens: Mapping[str, int]

    def for_role(self, role: str) -> int:
        """Per-message overhead of ``role`` (the largest known one for unusual roles)."""
        overhead = self.per_message_tokens.get(role)
        return overhead if overhead is not None else max(self.per_message_tokens.values())


def _special_token(config: Mapping[str, Any], key: str) -> str:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise_template_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt)


class TokenCache:
    """LRU of content → token ids, bounded by the total number of cached tokens."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[str, array[int]] = OrderedDict()
        self.cached_tokens = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, content: str) -> array[int] | None:
        """Cached ids of ``content`` (and mark it recently used), or None."""
        ids = self._entries.get(content)
        if ids is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(content)
        return ids

    def put(self, content: str, ids: array[int]) -> None:
        """Store ids; evict least recently used entries until the bound holds."""
        if len(ids) > self.max_tokens:
            return
        previous = self._entries.pop(content, None)
        if previous is not None:
            self.cached_tokens -= len(previous)
        self._entries[content] = ids
        self.cached_tokens += len(ids)
        while self.cached_tokens > self.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self.cached_tokens -= len(evicted)


class ChatTokenizer:
    """Tokenizer + chat template of the served model (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str,
        *,
        special_tokens: Mapping[str, str],
        cache_max_tokens: int = 2_000_000,
        template_source: str = "given",
    ) -> None:
        self.tokenizer = tokenizer
        self.template_source = template_source
        self.special_tokens = dict(special_tokens)
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_template_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            self._template = environment.from_string(chat_template)
        except jinja2.TemplateSyntaxError as error:
            raise ModelDirError(f"the chat template does not parse: {error}") from error
        self.cache = TokenCache(cache_max_tokens)
        self.reference: ChatRenderer | None = None
        """When set, the engine tokenizer's own rendering: it gives every prompt's token ids
        (gateway.rendering switches to it when the gateway's rendering differs from it)."""
        self._segment_ids: dict[str, array[int]] = {}
        self._skeletons: OrderedDict[tuple[tuple[str, ...], bool], list[str] | None] = (
            OrderedDict())
        self.segmented = False
        self.segmented = self._verify_segmented_assembly()
        self.overhead = self._measure_overhead()

    @classmethod
    def from_model_dir(cls, model_dir: Path, *, cache_max_tokens: int = 2_000_000) -> ChatTokenizer:
        """Load ``tokenizer.json`` and the chat template from a model directory."""
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelDirError(
                f"GATEWAY_MODEL_DIR={str(model_dir)!r}: no tokenizer.json there (the served "
                "model's tokenizer is required to count tokens)"
            )
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as error:
            raise ModelDirError(f"{tokenizer_file}: not a tokenizers file ({error})") from error
        config: dict[str, Any] = {}
        config_file = model_dir / "tokenizer_config.json"
        if config_file.is_file():
            try:
                loaded = json.loads(config_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise ModelDirError(f"{config_file}: not valid JSON ({error})") from error
            if isinstance(loaded, dict):
                config = loaded
        template, source = cls._find_template(model_dir, config)
        special = {key: _special_token(config, key)
                   for key in ("bos_token", "eos_token", "unk_token", "pad_token")}
        return cls(tokenizer, template, special_tokens=special,
                   cache_max_tokens=cache_max_tokens, template_source=source)

    @staticmethod
    def _find_template(model_dir: Path, config: Mapping[str, Any]) -> tuple[str, str]:
        jinja_file = model_dir / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8"), str(jinja_file)
        template = config.get("chat_template")
        if isinstance(template, str) and template.strip():
            return template, "tokenizer_config.json"
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {item.get("name"): item.get("template") for item in template
                     if isinstance(item, dict)}
            chosen = named.get("default") or next(iter(named.values()), None)
            if isinstance(chosen, str):
                return chosen, "tokenizer_config.json (named 'default')"
        return FALLBACK_CHAT_TEMPLATE, "fallback"

    # --- token ids ---
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as a whole (special-token strings become special tokens)."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def content_ids(self, contents: Sequence[str]) -> list[array[int]]:
        """Token ids of each content string, from the cache; misses are encoded in one batch."""
        found: list[array[int] | None] = [self.cache.get(content) for content in contents]
        missing = [index for index, ids in enumerate(found) if ids is None]
        if missing:
            unique = list(dict.fromkeys(contents[index] for index in missing))
            encodings = self.tokenizer.encode_batch(unique, add_special_tokens=False)
            fresh = {text: array("i", encoding.ids) for text, encoding in zip(unique, encodings,
                                                                               strict=True)}
            for text, ids in fresh.items():
                self.cache.put(text, ids)
            for index in missing:
                found[index] = fresh[contents[index]]
        return [ids for ids in found if ids is not None]

    def count(self, contents: Sequence[str]) -> list[int]:
        """Token count of each content string (cached)."""
        return [len(ids) for ids in self.content_ids(contents)]

    # --- chat template ---
    def render_text(self, turns: Sequence[ChatTurn], *, add_generation_prompt: bool = True) -> str:
        """The chat template applied to ``turns``; ChatTemplateError if the template refuses."""
        try:
            rendered: str = self._template.render(
                messages=[{"role": turn.role, "content": turn.content} for turn in turns],
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"the chat template failed: {error}") from error
        return rendered

    def render_prompt(
        self,
        turns: Sequence[ChatTurn],
        *,
        add_generation_prompt: bool = True,
        known_ids: Sequence[array[int] | None] | None = None,
    ) -> RenderedPrompt:
        """Render ``turns`` with the chat template and tokenize: the prompt the engine gets.

        ``known_ids`` (aligned with ``turns``) may carry content ids the caller already looked up.
        """
        if self.reference is not None and add_generation_prompt:
            text = self.render_text(turns, add_generation_prompt=add_generation_prompt)
            messages = [{"role": turn.role, "content": turn.content} for turn in turns]
            return RenderedPrompt(text=text, token_ids=array("i", self.reference(messages)))
        if self.segmented:
            assembled = self._assemble(turns, add_generation_prompt, known_ids)
            if assembled is not None:
                return assembled
        text = self.render_text(turns, add_generation_prompt=add_generation_prompt)
        return RenderedPrompt(text=text, token_ids=array("i", self.encode(text)))

    def render_whole(self, turns: Sequence[ChatTurn]) -> list[int]:
        """Token ids of the whole rendered text with the generation prompt (no segment cache)."""
        return self.encode(self.render_text(turns, add_generation_prompt=True))

    def _literals(self, roles: tuple[str, ...], add_generation_prompt: bool) -> list[str] | None:
        """The template's literal text around each message for this role sequence (cached)."""
        key = (roles, add_generation_prompt)
        if key in self._skeletons:
            self._skeletons.move_to_end(key)
            return self._skeletons[key]
        placeholders = [ChatTurn(role, f"\ue000{index}\ue001") for index, role in enumerate(roles)]
        skeleton = self.render_text(placeholders, add_generation_prompt=add_generation_prompt)
        pieces = _PLACEHOLDER.split(skeleton)
        # pieces = [literal, index, literal, index, ..., literal]; each message exactly once,
        # in order, or the template did something this fast path does not model.
        literals: list[str] | None = pieces[0::2]
        if pieces[1::2] != [str(index) for index in range(len(roles))]:
            literals = None
        self._skeletons[key] = literals
        if len(self._skeletons) > 4096:
            self._skeletons.popitem(last=False)
        return literals

    def _assemble(self, turns: Sequence[ChatTurn], add_generation_prompt: bool,
                  known_ids: Sequence[array[int] | None] | None = None) -> RenderedPrompt | None:
        literals = self._literals(tuple(turn.role for turn in turns), add_generation_prompt)
        if literals is None:
            return None
        contents = [turn.content for turn in turns]
        if known_ids is None:
            content_ids = self.content_ids(contents)
        else:
            missing = [index for index, known in enumerate(known_ids) if known is None]
            looked_up = iter(self.content_ids([contents[index] for index in missing]))
            content_ids = [known if known is not None else next(looked_up) for known in known_ids]
        prompt_ids: array[int] = array("i")
        text_parts: list[str] = []
        for position, literal in enumerate(literals):
            if literal:
                prompt_ids.extend(self._literal_ids(literal))
                text_parts.append(literal)
            if position < len(turns):
                prompt_ids.extend(content_ids[position])
                text_parts.append(contents[position])
        return RenderedPrompt(text="".join(text_parts), token_ids=prompt_ids)

    def _literal_ids(self, literal: str) -> array[int]:
        ids = self._segment_ids.get(literal)
        if ids is None:
            ids = array("i", self.encode(literal))
            if len(self._segment_ids) < 4096:
                self._segment_ids[literal] = ids
        return ids

    def _verify_segmented_assembly(self) -> bool:
        conversations: list[list[ChatTurn]] = []
        for offset in range(len(_PROBE_CONTENTS)):
            conversation = [ChatTurn("system", _PROBE_CONTENTS[offset])]
            for index in range(4):
                content = _PROBE_CONTENTS[(offset + index + 1) % len(_PROBE_CONTENTS)]
                conversation.append(ChatTurn("user" if index % 2 == 0 else "assistant", content))
            conversations.append(conversation)
        try:
            for conversation in conversations:
                for generation_prompt in (True, False):
                    whole = self.encode(self.render_text(conversation,
                                                         add_generation_prompt=generation_prompt))
                    assembled = self._assemble(conversation, generation_prompt)
                    if assembled is None or list(assembled.token_ids) != whole:
                        return False
        except ChatTemplateError:
            return False
        finally:
            self.cache = TokenCache(self.cache.max_tokens)  # probes must not occupy the cache
        return True

    def _measure_overhead(self) -> TemplateOverhead:
        def size(turns: list[ChatTurn], generation_prompt: bool = False) -> int:
            return self.render_prompt(turns, add_generation_prompt=generation_prompt).num_tokens

        def content(text: str) -> int:
            return len(self.encode(text))

        first = ChatTurn("system", "Manga")
        base = size([first])
        per_role: dict[str, int] = {}
        for role in ("system", "user", "assistant"):
            try:
                per_role[role] = max(0, size([first, ChatTurn(role, "volume")]) - base
                                     - content("volume"))
            except ChatTemplateError:
                continue
        if not per_role:
            per_role["user"] = 0
        first_overhead = per_role.get("system", max(per_role.values()))
        fixed = max(0, size([first], True) - first_overhead - content("Manga"))
        self.cache = TokenCache(self.cache.max_tokens)
        return TemplateOverhead(fixed_tokens=fixed, per_message_tokens=per_role)
