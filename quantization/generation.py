"""Real answer generators for the quality gate (the only place the gate touches a model).

- :class:`TransformersChatGenerator`: ``transformers`` generate, greedy, batched with left
  padding; GPU when present, CPU otherwise. Runs in the quantization environment, where
  compressed-tensors lets ``transformers`` load llm-compressor's output. (Loading AutoAWQ's
  ``quant_method: awq`` output in transformers 5 needs gptqmodel; gate AutoAWQ checkpoints with
  the vLLM generator.)
- :class:`VllmChatGenerator`: vLLM's offline ``LLM.chat`` — the serving engine itself, so the
  gate sees the kernels production runs. Needs a GPU and vLLM 0.33, i.e. the serving image.

Both render prompts with the model's own chat template and decode greedily, so baseline and
quantized answers differ only because the weights differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantization.calibration import ChatMessage


class TransformersChatGenerator:
    """Greedy chat generation with ``transformers`` from a local model directory."""

    def __init__(self, model_dir: Path, *, max_new_tokens: int = 384) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.max_new_tokens = max_new_tokens
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype="auto", local_files_only=True
        )
        self.model: Any = model.to(self.device)
        self.model.eval()

    def generate(self, conversations: Sequence[Sequence[ChatMessage]]) -> list[str]:
        """Answer each conversation (one left-padded batch)."""
        prompts = [
            self.tokenizer.apply_chat_template(
                [dict(message) for message in conversation],
                tokenize=False,
                add_generation_prompt=True,
            )
            for conversation in conversations
        ]
        encoded: Any = self.tokenizer(
            prompts,
            add_special_tokens=False,  # the chat template already wrote BOS
            padding=True,
            padding_side="left",
            return_tensors="pt",
        ).to(self.device)
        with self._torch.inference_mode():
            output = self.model.generate(
                **encoded,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        prompt_len = encoded["input_ids"].shape[1]
        return [
            self.tokenizer.decode(sequence[prompt_len:], skip_special_tokens=True).strip()
            for sequence in output
        ]


class VllmChatGenerator:
    """Greedy chat generation with vLLM's offline engine (GPU, serving image)."""

    def __init__(
        self,
        model_dir: Path,
        *,
        max_new_tokens: int = 384,
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.85,
    ) -> None:
        from vllm import LLM, SamplingParams

        # quantization is read from config.json (compressed-tensors or awq).
        self._llm = LLM(
            model=str(model_dir),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        self._sampling = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)

    def generate(self, conversations: Sequence[Sequence[ChatMessage]]) -> list[str]:
        """Answer each conversation with ``LLM.chat`` (batched by the engine)."""
        outputs = self._llm.chat(
            [[dict(message) for message in conversation] for conversation in conversations],
            sampling_params=self._sampling,
            use_tqdm=False,
        )
        return [output.outputs[0].text.strip() for output in outputs]


def release_accelerator_memory() -> None:
    """Collect dropped models and hand cached GPU memory back (no-op without a GPU)."""
    import gc

    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
