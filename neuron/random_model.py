"""A randomly initialised DistilBERT intent classifier and WordPiece tokenizer, built locally.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on a small manga corpus and
the model is ``DistilBertForSequenceClassification`` with random weights, labelled with the
router's intents. Tests compile and serve the ``tiny`` size; the benchmark uses ``base``, which
has DistilBERT-base's shapes (6 layers, 768 wide, 12 heads), so its latency is representative even
though its answers are not.

``python -m neuron.random_model OUT_DIR [--size tiny|base]`` writes a Hugging Face model directory
that ``python -m neuron.compile --model-dir`` accepts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from intents import INTENT_LABELS
from neuron.samples import LONG_QUERY, SAMPLE_QUERIES


@dataclass(frozen=True)
class ModelSize:
    """DistilBERT dimensions."""

    dim: int
    n_layers: int
    n_heads: int
    hidden_dim: int


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(dim=32, n_layers=2, n_heads=2, hidden_dim=64),
    "base": ModelSize(dim=768, n_layers=6, n_heads=12, hidden_dim=3072),
}

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

MANGA_CORPUS: tuple[str, ...] = (
    *(text for text, _ in SAMPLE_QUERIES),
    LONG_QUERY,
    "Which volume of Frieren has the extra chapter?",
    "Can I pre-order the next Blue Lock volume?",
    "Please cancel my order and refund the payment",
    "My package tracking number does not work",
    "Thanks, that was helpful, have a nice day",
    "Do you sell digital editions or only paperback?",
    "新刊の予約はできますか",
    "配送状況を確認したいです",
    "おすすめの少女漫画はありますか",
    "ありがとう、またね",
)


def build_random_distilbert(out_dir: Path, *, size: str = "tiny", seed: int = 0,
                            vocab_size: int = 1000, max_position_embeddings: int = 512) -> Path:
    """Write a random DistilBERT sequence classifier + fast tokenizer into ``out_dir``.

    The head has one output per intent, in ``INTENT_LABELS`` order, with ``id2label`` set, as a
    fine-tuned checkpoint would. Returns ``out_dir``.
    """
    if size not in SIZES:
        raise ValueError(f"size: {size!r} is not one of {sorted(SIZES)}")
    import torch
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        PreTrainedTokenizerFast,
    )

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS))
    tokenizer.train_from_iterator(MANGA_CORPUS * 4, trainer)
    token_ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, token_id in token_ids.items() if token_id is None]
    if missing:  # pragma: no cover - the trainer always adds its special tokens
        raise RuntimeError(f"tokenizer training lost special tokens {missing}")
    sep_id, cls_id, pad_id = (int(token_ids[t] or 0) for t in ("[SEP]", "[CLS]", "[PAD]"))
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", sep_id), ("[CLS]", cls_id))

    out_dir.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_position_embeddings)
    fast.save_pretrained(str(out_dir))

    dims = SIZES[size]
    config = DistilBertConfig(
        vocab_size=tokenizer.get_vocab_size(), dim=dims.dim, n_layers=dims.n_layers,
        n_heads=dims.n_heads, hidden_dim=dims.hidden_dim,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=pad_id, id2label=dict(enumerate(INTENT_LABELS)),
        label2id={label: index for index, label in enumerate(INTENT_LABELS)},
    )
    torch.manual_seed(seed)
    model = DistilBertForSequenceClassification(config)
    model.eval()
    model.save_pretrained(str(out_dir))
    return out_dir


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: write a random model directory."""
    parser = argparse.ArgumentParser(prog="python -m neuron.random_model",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    build_random_distilbert(args.out_dir, size=args.size, seed=args.seed)
    print(f"random {args.size} DistilBERT intent classifier written to {args.out_dir}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
