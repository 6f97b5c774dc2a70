"""Real answer generators for the quality gate (the only place the gate touches a model).

- :class:`TransformersChatGenerator`: ``transformers`` generate, greedy, batched with left
  padding; GPU when present, CPU otherwise. Runs in the quantization environment, where
  compressed-tensors lets ``transformers`` load llm-compressor's output. (Loading AutoAWQ's
  ``quant_method: awq`` output in transformers 5 needs gptqmodel; gate AutoAWQ checkpoints with
  the vLLM generator.)
- :class:`VllmChatGenerator`: vLLM's offline ``LLM.chat`` — the serving engine itself, so the
  gate sees the kernels production runs. Needs a GPU and vLLM 0.33, i.e. the serving image.

Both render prompts with the model's own chat template and decode greedily, so baseline and
quantized answers differ only because the weights differ. Both apply a PEFT LoRA adapter on top of
the model they loaded (:meth:`use_adapter`), as the serving engine does: the adapter's
``scale · B·A·x`` is added to each target module's output, whatever that module's weights are
(bf16, or AWQ INT4 unpacked by compressed-tensors), so an fp16-trained adapter is evaluated on the
quantized base exactly as it will be served.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantization.adapters import (
    ADAPTER_WEIGHTS,
    AdapterError,
    lora_modules,
    lora_scale,
    read_adapter_config,
)
from quantization.calibration import ChatMessage


def attach_lora(model: Any, adapter_dir: Path) -> list[Any]:
    """Add ``adapter_dir``'s LoRA to ``model`` with forward hooks; the hook handles (remove
    them to drop the adapter). AdapterError names a module the model does not have."""
    import torch
    from safetensors.torch import load_file

    scale = lora_scale(read_adapter_config(adapter_dir), where=str(adapter_dir))
    tensors = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    pairs = lora_modules(list(tensors), where=str(adapter_dir / ADAPTER_WEIGHTS))
    named = dict(model.named_modules())
    missing = [module for module in pairs if module not in named]
    if missing:
        raise AdapterError(f"{adapter_dir}: the model has no module {missing[0]!r} for this "
                           "adapter (trained for another architecture?)")
    device = next(model.parameters()).device
    handles = []
    for module, (a_key, b_key) in pairs.items():
        lora_a = tensors[a_key].to(device=device, dtype=torch.float32)
        lora_b = tensors[b_key].to(device=device, dtype=torch.float32)

        def hook(_module: Any, inputs: tuple[Any, ...], output: Any,
                 lora_a: Any = lora_a, lora_b: Any = lora_b) -> Any:
            delta = (inputs[0].to(torch.float32) @ lora_a.T) @ lora_b.T
            return output + (scale * delta).to(output.dtype)

        handles.append(named[module].register_forward_hook(hook))
    return handles


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
        self._lora_handles: list[Any] = []

    def use_adapter(self, name: str | None, adapter_dir: Path | None) -> None:
        """Answer with ``adapter_dir``'s LoRA on top of the model from now on (None: without)."""
        for handle in self._lora_handles:
            handle.remove()
        self._lora_handles = [] if adapter_dir is None else attach_lora(self.model, adapter_dir)

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
        max_lora_rank: int = 64,
    ) -> None:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        # quantization is read from config.json (compressed-tensors or awq).
        self._llm = LLM(
            model=str(model_dir),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_lora=True,
            max_lora_rank=max_lora_rank,
        )
        self._sampling = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        self._lora_request_type = LoRARequest
        self._lora: Any = None
        self._lora_ids: dict[str, int] = {}

    def use_adapter(self, name: str | None, adapter_dir: Path | None) -> None:
        """Answer through ``adapter_dir``'s LoRA (vLLM's ``LoRARequest``) from now on."""
        if name is None or adapter_dir is None:
            self._lora = None
            return
        lora_id = self._lora_ids.setdefault(name, len(self._lora_ids) + 1)
        self._lora = self._lora_request_type(name, lora_id, str(adapter_dir))

    def generate(self, conversations: Sequence[Sequence[ChatMessage]]) -> list[str]:
        """Answer each conversation with ``LLM.chat`` (batched by the engine)."""
        outputs = self._llm.chat(
            [[dict(message) for message in conversation] for conversation in conversations],
            sampling_params=self._sampling,
            use_tqdm=False,
            lora_request=self._lora,
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
