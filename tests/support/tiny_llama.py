"""A tiny, random Llama-3-style model directory laid out the way the LLM endpoint reads its model.

Nothing is downloaded. The tokenizer is a byte-level BPE trained here on the project's own manga
Q&A sample (so Japanese text round-trips), with Llama-3's special tokens, its BOS-adding
post-processor and Llama-3-Instruct's chat template; the model is a ``LlamaForCausalLM`` with
random weights saved as bf16 safetensors; LoRA adapters are random PEFT adapters under
``adapters/<directory>/`` (``adapter_config.json`` + ``adapter_model.safetensors``), which is where
the endpoint's S3 prefix puts them (``llm.adapters[].directory``). Layer widths are multiples of
128 so that AWQ's default group size applies exactly as it does to Llama-3-8B.

Who uses it: the quantization tests (AWQ on CPU), the real-engine test tier (vLLM's CPU build
loads this directory, adapters included) and ``benchmarks/gateway_vs_vllm.py``.
:func:`cached_model_dir` builds a directory once per content key and reuses it.

    python -m tests.support.tiny_llama OUT_DIR [--max-positions 1024] [--adapter manga_domain:8 ...]

torch, transformers and safetensors are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prompts import LLAMA3_BOS, LLAMA3_EOT, LLAMA3_INSTRUCT_CHAT_TEMPLATE, LLAMA3_SPECIAL_TOKENS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
MANGA_QA = REPO_ROOT / "quantization" / "data" / "manga_qa.jsonl"

HIDDEN_SIZE = 256
INTERMEDIATE_SIZE = 512
NUM_LAYERS = 2
NUM_ATTENTION_HEADS = 4
NUM_KV_HEADS = 2
LORA_TARGET_MODULES = ("q_proj", "v_proj")


@dataclass(frozen=True)
class AdapterFixture:
    """A random LoRA adapter to write under ``adapters/<directory>/``."""

    directory: str
    rank: int = 8
    seed: int = 1


def _training_texts(qa_jsonl: Path) -> Iterator[str]:
    with qa_jsonl.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                yield record["question"]
                yield record["answer"]


def train_byte_level_bpe(texts: Iterable[str], *, vocab_size: int) -> Tokenizer:
    """The project's one tokenizer trainer: a byte-level BPE with Llama-3's special tokens,
    trained on ``texts`` (every byte is in the alphabet, so any text round-trips). The tiny
    Llama and the demo model (:mod:`tests.support.demo_model`) each bring their corpus and size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(LLAMA3_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_tiny_llama3_tokenizer(qa_jsonl: Path, out_dir: Path, *, vocab_size: int = 768) -> None:
    """Train a byte-level BPE on ``qa_jsonl`` and save it as a Llama-3-style tokenizer."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_byte_level_bpe(_training_texts(qa_jsonl), vocab_size=vocab_size)
    bos_id = tokenizer.token_to_id(LLAMA3_BOS)
    # Llama-3's tokenizer.json prepends BOS to every encode: the chat template also writes it,
    # so a correct caller must tokenize rendered chat text with add_special_tokens=False.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[(LLAMA3_BOS, bos_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=LLAMA3_BOS,
        eos_token=LLAMA3_EOT,
        pad_token="<|end_of_text|>",
        model_max_length=8192,
    )
    fast.chat_template = LLAMA3_INSTRUCT_CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def build_tiny_llama(qa_jsonl: Path, out_dir: Path, *, seed: int = 0,
                     max_position_embeddings: int = 1024, scale: int = 1) -> Path:
    """Write a tokenizer and a random bf16 ``LlamaForCausalLM`` to ``out_dir``; return it.
    ``scale`` multiplies the hidden and intermediate sizes and the layers (a model whose
    compute a benchmark can measure: ``benchmarks/capacity_check.py`` takes 2)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    build_tiny_llama3_tokenizer(qa_jsonl, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE * scale,
        intermediate_size=INTERMEDIATE_SIZE * scale,
        num_hidden_layers=NUM_LAYERS * scale,
        num_attention_heads=NUM_ATTENTION_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.set_default_dtype(torch.bfloat16)  # build the weights in bf16 directly
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out_dir))
    return out_dir


def build_random_lora(model_dir: Path, adapter: AdapterFixture) -> Path:
    """Write a random PEFT LoRA adapter for ``model_dir`` to ``model_dir/adapters/<directory>``.

    The tensors are named and shaped as ``peft`` saves them (``base_model.model.<module>.lora_A/B
    .weight``) for ``q_proj`` and ``v_proj`` of every layer; lora_B is random (not peft's zero
    initialisation) so that an adapter really changes the output.
    """
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // int(config["num_attention_heads"]))
    out_features = {"q_proj": int(config["num_attention_heads"]) * head_dim,
                    "v_proj": int(config["num_key_value_heads"]) * head_dim}
    generator = torch.Generator().manual_seed(adapter.seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module in LORA_TARGET_MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(adapter.rank, hidden, generator=generator) * 0.05).to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out_features[module], adapter.rank, generator=generator) * 0.05
            ).to(torch.bfloat16)
    out_dir = model_dir / "adapters" / adapter.directory
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": adapter.rank,
        "lora_alpha": 2 * adapter.rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(LORA_TARGET_MODULES), "fan_in_fan_out": False,
        "base_model_name_or_path": "tiny-llama3",
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n",
                                                 encoding="utf-8")
    return out_dir


def build_model_dir(out_dir: Path, *, max_position_embeddings: int = 1024,
                    adapters: Sequence[AdapterFixture] = (), scale: int = 1) -> Path:
    """The tiny model with its adapters, in one directory."""
    build_tiny_llama(MANGA_QA, out_dir, max_position_embeddings=max_position_embeddings,
                     scale=scale)
    for adapter in adapters:
        build_random_lora(out_dir, adapter)
    return out_dir


def _content_key(max_position_embeddings: int, adapters: Sequence[AdapterFixture],
                 scale: int = 1) -> str:
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    digest.update(MANGA_QA.read_bytes())
    digest.update(repr((LLAMA3_INSTRUCT_CHAT_TEMPLATE, LLAMA3_SPECIAL_TOKENS)).encode())
    digest.update(repr((max_position_embeddings, tuple(adapters))).encode())
    if scale != 1:
        digest.update(f"scale {scale}".encode())
    return digest.hexdigest()[:16]


def cached_model_dir(cache_root: Path, *, max_position_embeddings: int = 1024,
                     adapters: Sequence[AdapterFixture] = (), scale: int = 1) -> Path:
    """Build the model directory once per content key under ``cache_root`` and reuse it.

    The key covers this module's source, the training text, the chat format and the parameters,
    so a change to any of them builds a new directory. The build writes to a temporary sibling
    and renames it, so an interrupted build is never mistaken for a finished one.
    """
    key = _content_key(max_position_embeddings, adapters, scale)
    target = cache_root / f"tiny-llama3-{key}"
    if (target / ".complete").is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = cache_root / f".tiny-llama3-{key}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    build_model_dir(staging, max_position_embeddings=max_position_embeddings, adapters=adapters,
                    scale=scale)
    (staging / ".complete").write_text(key + "\n", encoding="utf-8")
    try:
        staging.rename(target)
    except OSError:  # another process finished the same build first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _adapter(text: str) -> AdapterFixture:
    directory, _, rank = text.partition(":")
    if not directory or (rank and not rank.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected DIRECTORY or DIRECTORY:RANK")
    return AdapterFixture(directory, int(rank or 8), seed=zlib.crc32(directory.encode()))


def main(argv: Sequence[str] | None = None) -> int:
    """Build a tiny model directory (with adapters) at OUT_DIR."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.tiny_llama", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--max-positions", type=int, default=1024,
                        help="max_position_embeddings of the model (default 1024)")
    parser.add_argument("--adapter", type=_adapter, action="append", default=[],
                        help="a random LoRA adapter DIRECTORY[:RANK] (repeatable)")
    args = parser.parse_args(argv)
    build_model_dir(args.out_dir, max_position_embeddings=args.max_positions,
                    adapters=args.adapter)
    print(f"wrote {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
