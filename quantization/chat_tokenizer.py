"""The served model's own tokenizer and chat template, loaded from the model directory.

Adapts a Hugging Face tokenizer to :class:`quantization.calibration.ChatTokenizer`. Never
tiktoken or a hand-written template: Llama-3's vocabulary and header tokens are what the served
model sees (docs/design-decisions.md#served-tokenizer). Loads from local files only — nothing is
downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantization.calibration import ChatMessage


class HuggingFaceChatTokenizer:
    """A ``transformers`` tokenizer seen through the :class:`ChatTokenizer` protocol."""

    def __init__(self, tokenizer: Any, *, source: str = "<tokenizer>") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"{source}: the tokenizer has no chat template; calibration must use the served "
                "model's own template (Llama-3-Instruct ships one in tokenizer_config.json or "
                "chat_template.jinja)"
            )
        self._tokenizer = tokenizer

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> HuggingFaceChatTokenizer:
        """Load the tokenizer files of ``model_dir`` (local files only)."""
        from transformers import AutoTokenizer

        if not model_dir.is_dir():
            raise ValueError(f"model_dir: {model_dir} is not a directory")
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        return cls(tokenizer, source=str(model_dir))

    @property
    def hf_tokenizer(self) -> Any:
        """The wrapped ``transformers`` tokenizer (to save it next to a quantized checkpoint)."""
        return self._tokenizer

    def render_chat(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool) -> str:
        """Render with the tokenizer's chat template, as vLLM does for a chat request."""
        rendered = self._tokenizer.apply_chat_template(
            [dict(message) for message in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        if not isinstance(rendered, str):
            raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, not str")
        return rendered

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered chat text; the template already wrote BOS, so add none."""
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])
