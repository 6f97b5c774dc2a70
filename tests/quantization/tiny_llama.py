"""Build a tiny, random Llama-architecture model directory the way the real one looks on disk.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here on the project's own manga
Q&A sample (so Japanese text round-trips), carries Llama-3's special tokens, its BOS-adding
post-processor and Llama-3-Instruct's chat template; the model is a ``LlamaForCausalLM`` with
random weights saved as bf16 safetensors. Layer widths are multiples of 128 so that AWQ's default
group size applies exactly as it does to Llama-3-8B.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

# Meta-Llama-3-8B-Instruct's chat template, verbatim from its tokenizer_config.json.
LLAMA3_INSTRUCT_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

LLAMA3_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)

HIDDEN_SIZE = 256
INTERMEDIATE_SIZE = 512
NUM_LAYERS = 2


def _training_texts(qa_jsonl: Path) -> Iterator[str]:
    with qa_jsonl.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                yield record["question"]
                yield record["answer"]


def build_tiny_llama3_tokenizer(qa_jsonl: Path, out_dir: Path, *, vocab_size: int = 768) -> None:
    """Train a byte-level BPE on ``qa_jsonl`` and save it as a Llama-3-style tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(LLAMA3_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_texts(qa_jsonl), trainer=trainer)
    bos_id = tokenizer.token_to_id("<|begin_of_text|>")
    # Llama-3's tokenizer.json prepends BOS to every encode: the chat template also writes it,
    # so a correct caller must tokenize rendered chat text with add_special_tokens=False.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        model_max_length=8192,
    )
    fast.chat_template = LLAMA3_INSTRUCT_CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def build_tiny_llama(qa_jsonl: Path, out_dir: Path, *, seed: int = 0) -> Path:
    """Write a tokenizer and a random bf16 ``LlamaForCausalLM`` to ``out_dir``; return it."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    build_tiny_llama3_tokenizer(qa_jsonl, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out_dir))
    return out_dir
