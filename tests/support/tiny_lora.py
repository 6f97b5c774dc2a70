"""Tiny trained models for the per-adapter quality gate: a tiny Llama taught one task, and LoRA
adapters taught others, each answering its own prompts in a way the gate can score.

The gate needs adapters whose answers differ measurably from the base model's on the adapter's
own prompts, or a broken adapter would look like a working one. A random adapter
(:func:`tests.support.tiny_llama.build_random_lora`) only perturbs gibberish; these are trained
here: the base model on a "greeting" task, each adapter on its own prompts. Prompts are sent as
the gate sends them — the production system prompt, then the question, in the model's chat
template — and the loss covers only the answer and its end-of-turn token, so greedy decoding
reproduces the answer and stops.

What is trained is the last decoder layer's ``o_proj`` and ``down_proj`` (the base: their
weights; an adapter: a LoRA on each). Both act on one position at a time after the layer's
attention, so with everything before them frozen, the inputs they see are computed once per
prompt (one forward pass without gradients) and training runs on the answer positions alone —
a few dozen rows instead of ~450-token sequences (the system prompt), which keeps it to well
under a second on the CPU.

The adapters are written the way ``peft`` saves them (``adapter_config.json`` with ``r``,
``lora_alpha``, ``target_modules``, ``layers_to_transform``;
``base_model.model.<module>.lora_A/B.weight`` tensors in ``adapter_model.safetensors``), so the
gate's generators and vLLM read them as any other. torch and transformers are imported inside
the functions.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompts import LLAMA3_EOT, MANGAASSIST_SYSTEM_PROMPT

LORA_MODULES = ("o_proj", "down_proj")
LOGIT_SHARPENING = 20.0
MARGIN = 6.0
"""Logits by which every answer token must lead the next best token once trained."""
SMOOTHING_JITTER = 0.8
"""Log-normal spread of the per-channel factors an adapter's inputs are scaled by in training.

AWQ folds a smoothing scale into each pair it balances (norm -> q/k/v, up -> down, v -> o where
the shapes allow): the quantized ``down_proj`` receives ``x / s`` and its weights carry ``s``,
so the base computes the same thing, but a LoRA trained on the fp16 base reads ``x / s`` too. On
this tiny model the ratio of ``down_proj``'s inputs, fp16 to AWQ, spans 0.35-3.5 (5th-95th percentile) and
an adapter trained without them lost 6-13 logits of its lead on the AWQ base, and whether it
still answered depended on the CPU's instruction set (it failed CI on one). Trained with factors
drawn at this spread, the leads kept on the AWQ base were 1.2-6.9 logits across four ATen/oneDNN
instruction sets (native AVX-512 bf16, AVX-512 core, AVX2, none).
"""


@dataclass(frozen=True)
class Task:
    """A task: its prompts, the one answer it gives to each, and what the gate requires.

    One answer per task: the prompts differ by a few tokens after a ~450-token system prompt, so
    in a model this small their representations barely differ; what tells the tasks apart is
    which weights answer (the base's, or an adapter's), as in production.
    """

    name: str
    answer: str
    prompts: tuple[tuple[str, str, str, str], ...]
    """``(item id, language, prompt, term the answer must contain)``."""

    def write_eval_set(self, path: Path) -> Path:
        """This task as an evaluation set (JSONL, one item per prompt)."""
        rows = [{"id": item_id, "language": language, "prompt": prompt, "required_terms": [term]}
                for item_id, language, prompt, term in self.prompts]
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows),
                        encoding="utf-8")
        return path


def _sequences(tokenizer: Any, task: Task) -> list[tuple[list[int], int]]:
    """``(token ids, answer start)`` per prompt, rendered as the gate renders its prompts."""
    answer_ids = tokenizer(task.answer + LLAMA3_EOT, add_special_tokens=False)["input_ids"]
    sequences = []
    for _, _, prompt, _ in task.prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": MANGAASSIST_SYSTEM_PROMPT},
             {"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        sequences.append((prompt_ids + answer_ids, len(prompt_ids)))
    return sequences


@dataclass(frozen=True)
class _Rows:
    """Per answer position: the last layer's input, its ``o_proj`` input, the next token."""

    layer_in: Any
    attention_out: Any
    targets: Any


def _capture(model: Any, sequences: Sequence[tuple[list[int], int]]) -> _Rows:
    """One forward pass per prompt (no gradients), keeping what the last layer's tail sees at
    each position that predicts an answer token."""
    import torch

    layer = model.model.layers[-1]
    seen: dict[str, Any] = {}

    def keep_layer_in(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen["layer_in"] = args[0] if args else kwargs["hidden_states"]

    def keep_attention(_m: Any, args: tuple[Any, ...]) -> None:
        seen["attention_out"] = args[0]

    handles = [layer.register_forward_pre_hook(keep_layer_in, with_kwargs=True),
               layer.self_attn.o_proj.register_forward_pre_hook(keep_attention)]
    rows: dict[str, list[Any]] = {"layer_in": [], "attention_out": [], "targets": []}
    try:
        with torch.no_grad():
            for ids, start in sequences:
                model(input_ids=torch.tensor([ids]))
                positions = slice(start - 1, len(ids) - 1)
                rows["layer_in"].append(seen["layer_in"][0, positions])
                rows["attention_out"].append(seen["attention_out"][0, positions])
                rows["targets"].append(torch.tensor(ids[start:]))
    finally:
        for handle in handles:
            handle.remove()
    return _Rows(*(torch.cat(rows[key]) for key in ("layer_in", "attention_out", "targets")))


def _tail_logits(model: Any, rows: _Rows) -> Any:
    """The last decoder layer after its attention, the final norm and lm_head (as
    ``LlamaDecoderLayer.forward`` computes them), on the captured rows."""
    layer = model.model.layers[-1]
    hidden = rows.layer_in + layer.self_attn.o_proj(rows.attention_out)
    hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.lm_head(model.model.norm(hidden))


def _margin(model: Any, rows: _Rows) -> float:
    """The smallest lead of an answer token's logit over the best other token's."""
    import torch

    with torch.no_grad():
        logits = _tail_logits(model, rows)
        target = logits.gather(1, rows.targets[:, None])[:, 0]
        others = logits.scatter(1, rows.targets[:, None], float("-inf")).max(dim=1).values
        return float((target - others).min())


def _fit(model: Any, parameters: Sequence[Any], rows: _Rows, *, max_steps: int,
         learning_rate: float, margin: float,
         perturb: Callable[[bool], None] = lambda _on: None) -> float:
    """Adam on the cross-entropy of the answer tokens, plus a hinge at ``margin`` + 1, until
    every answer token leads by ``margin`` logits (an answer that survives the AWQ model's
    perturbed activations, as a trained model's does) or ``max_steps``; the margin reached.
    ``perturb(True)`` runs before each step (an adapter's smoothing factors, redrawn) and
    ``perturb(False)`` before each check, which is made on the unperturbed model."""
    import torch

    optimizer = torch.optim.Adam(parameters, lr=learning_rate)
    reached = _margin(model, rows)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few dozen rows: threads would only wait on each other
    try:
        for step in range(1, max_steps + 1):
            optimizer.zero_grad()
            perturb(True)
            logits = _tail_logits(model, rows)
            target = logits.gather(1, rows.targets[:, None])[:, 0]
            others = logits.scatter(1, rows.targets[:, None], float("-inf")).max(dim=1).values
            # Cross-entropy's gradient vanishes as the answer becomes certain, long before it
            # leads by a margin that survives quantization: the hinge keeps pushing until it does.
            hinge = torch.relu(margin + 1.0 - (target - others)).mean()
            (torch.nn.functional.cross_entropy(logits, rows.targets) + hinge).backward()
            optimizer.step()
            if step % 10 == 0:
                perturb(False)
                reached = _margin(model, rows)
                if reached >= margin:
                    break
    finally:
        perturb(False)
        torch.set_num_threads(threads)
    return reached


def _check_learned(what: str, reached: float, margin: float) -> None:
    """Under teacher forcing, every answer token leads by ``margin`` (what greedy decoding then
    reproduces, on the AWQ model too); RuntimeError otherwise."""
    if reached < margin:
        raise RuntimeError(f"{what}: the answer's weakest token leads by {reached:.2f} logits, "
                           f"not {margin:g}: not learned")


def _load(model_dir: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.requires_grad_(False)
    return tokenizer, model


def train_base(model_dir: Path, out_dir: Path, task: Task, *, max_steps: int = 300,
               learning_rate: float = 3e-3, margin: float = MARGIN) -> Path:
    """Teach ``model_dir`` ``task`` (the last layer's ``o_proj`` and ``down_proj`` weights);
    write the model (bf16, with its tokenizer) to ``out_dir``."""
    import torch

    torch.manual_seed(0)
    tokenizer, model = _load(model_dir)
    rows = _capture(model, _sequences(tokenizer, task))
    # A random tiny model's logits are nearly flat (lm_head at std 0.02 over 256 dimensions
    # reaches a margin of ~5 at most): sharpen them as training a real model does, so that the
    # layer's weights, and an adapter's, can make one answer certain.
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SHARPENING)
    layer = model.model.layers[-1]
    weights = [layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight]
    for weight in weights:
        weight.requires_grad_(True)
    reached = _fit(model, weights, rows, max_steps=max_steps, learning_rate=learning_rate,
                   margin=margin)
    _check_learned("base model", reached, margin)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(out_dir))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja"):
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out_dir / name)
    return out_dir


def train_lora(model_dir: Path, out_dir: Path, task: Task, *, rank: int = 8,
               max_steps: int = 1500, learning_rate: float = 3e-3, margin: float = MARGIN,
               seed: int = 1) -> Path:
    """Train a LoRA adapter on the last layer's ``o_proj`` and ``down_proj`` (the base frozen)
    on ``task``; write it to ``out_dir`` as PEFT does."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    tokenizer, model = _load(model_dir)
    rows = _capture(model, _sequences(tokenizer, task))
    alpha, last = 2 * rank, len(model.model.layers) - 1
    layer = model.model.layers[last]
    factors: dict[str, tuple[Any, Any]] = {}
    jitter: dict[str, Any] = {}
    for name, module in ((f"model.layers.{last}.self_attn.o_proj", layer.self_attn.o_proj),
                         (f"model.layers.{last}.mlp.down_proj", layer.mlp.down_proj)):
        lora_a = torch.nn.Parameter(torch.randn(rank, module.in_features)
                                    / module.in_features ** 0.5)
        lora_b = torch.nn.Parameter(torch.zeros(module.out_features, rank))
        factors[name] = (lora_a, lora_b)
        jitter[name] = torch.ones(module.in_features)

        def hook(_m: Any, inputs: tuple[Any, ...], output: Any, a: Any = lora_a,
                 b: Any = lora_b, key: str = name) -> Any:
            return output + (alpha / rank) * ((inputs[0] * jitter[key]) @ a.T) @ b.T

        module.register_forward_hook(hook)
    parameters = [p for pair in factors.values() for p in pair]

    def perturb(on: bool) -> None:
        for factor in jitter.values():
            if on:
                factor.copy_(torch.exp(SMOOTHING_JITTER * torch.randn(factor.shape)))
            else:
                factor.fill_(1.0)

    reached = _fit(model, parameters, rows, max_steps=max_steps, learning_rate=learning_rate,
                   margin=margin, perturb=perturb)
    _check_learned(f"adapter {task.name}", reached, margin)
    tensors = {}
    for name, (lora_a, lora_b) in factors.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = lora_a.detach().to(torch.bfloat16)
        tensors[f"base_model.model.{name}.lora_B.weight"] = lora_b.detach().to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "lora_dropout": 0.0, "bias": "none", "target_modules": list(LORA_MODULES),
              "layers_to_transform": [last], "fan_in_fan_out": False,
              "base_model_name_or_path": "tiny-llama3"}
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                 encoding="utf-8")
    return out_dir


def scaled_copy(adapter_dir: Path, out_dir: Path, factor: float) -> Path:
    """A copy of an adapter with every lora_B scaled by ``factor`` (a broken adapter)."""
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(adapter_dir / "adapter_config.json", out_dir / "adapter_config.json")
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    save_file({key: tensor * factor if ".lora_B." in key else tensor
               for key, tensor in tensors.items()}, str(out_dir / "adapter_model.safetensors"))
    return out_dir
