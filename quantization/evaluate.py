"""Quality gate CLI: score the baseline and the quantized model, measure both, pass or fail.

    python -m quantization.evaluate --baseline-model BASE_DIR --quantized-model QUANT_DIR \\
        [--generator transformers|vllm] [--report-dir quality_gate/]

Answers come from an injectable :class:`ChatGenerator` (``transformers`` in the quantization
image, ``vllm`` in the serving image, or answers generated elsewhere and passed with
``--baseline-responses`` / ``--quantized-responses``). Each prompt is sent as production sends
it: the gateway's system prompt, then the customer's question. Writes ``quality_gate.json``,
``quality_gate.md`` and both models' answers to the report directory, prints the Markdown
verdict, and exits 0 when the gate passes, 1 when it fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from prompts import MANGAASSIST_SYSTEM_PROMPT
from quantization.calibration import ChatMessage, DatasetError, parse_jsonl_objects
from quantization.checkpoint import CheckpointError, measure_checkpoint_weights
from quantization.gate import (
    GateReport,
    GateThresholds,
    MemoryFigures,
    aggregate_scores,
    decide,
    render_markdown,
    report_to_dict,
)
from quantization.scoring import (
    EvalItem,
    TitleCatalog,
    load_eval_set,
    load_title_catalog,
    score_responses,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_EVAL_SET = DATA_DIR / "eval_set.jsonl"
DEFAULT_TITLES = DATA_DIR / "known_titles.json"

Conversation = Sequence[ChatMessage]
ProgressFn = Callable[[str], None]


class ChatGenerator(Protocol):
    """Answers a batch of conversations, one answer per conversation, in order."""

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Generate the assistant's next message for each conversation."""
        ...


class PerConversationGenerator:
    """Adapts a one-conversation function (``messages -> answer``) to :class:`ChatGenerator`."""

    def __init__(self, generate_one: Callable[[Conversation], str]) -> None:
        self._generate_one = generate_one

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Call the wrapped function once per conversation."""
        return [self._generate_one(conversation) for conversation in conversations]


class LazyGenerator:
    """Builds its generator on first use and can drop it again.

    The gate runs one model at a time: an 8B baseline in bf16 and the quantized model
    (decompressed by transformers) do not fit on one 24 GiB GPU together.
    """

    def __init__(self, factory: Callable[[], ChatGenerator]) -> None:
        self._factory = factory
        self._generator: ChatGenerator | None = None

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Build the generator if needed, then delegate."""
        if self._generator is None:
            self._generator = self._factory()
        return self._generator.generate(conversations)

    def release(self) -> None:
        """Drop the model and return its accelerator memory."""
        self._generator = None
        from quantization.generation import release_accelerator_memory

        release_accelerator_memory()


class RecordedResponses:
    """Answers generated earlier, read from JSONL rows ``{"id": ..., "response": ...}``."""

    def __init__(self, responses_by_id: dict[str, str], items: Sequence[EvalItem]) -> None:
        missing = [item.item_id for item in items if item.item_id not in responses_by_id]
        if missing:
            raise DatasetError(f"responses: no answer for item(s) {', '.join(missing)}")
        self._by_prompt = {item.prompt: responses_by_id[item.item_id] for item in items}

    @classmethod
    def from_jsonl(cls, path: Path, items: Sequence[EvalItem]) -> RecordedResponses:
        """Load a responses file written by this CLI (or by any generator)."""
        by_id: dict[str, str] = {}
        with path.open(encoding="utf-8") as handle:
            for where, obj in parse_jsonl_objects(handle, source=str(path)):
                item_id, response = obj.get("id"), obj.get("response")
                if not isinstance(item_id, str) or not isinstance(response, str):
                    raise DatasetError(f"{where}: needs string fields 'id' and 'response'")
                by_id[item_id] = response
        return cls(by_id, items)

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Look each conversation's answer up by its user prompt."""
        return [self._by_prompt[conversation[-1]["content"]] for conversation in conversations]


def eval_conversation(
    item: EvalItem, system_prompt: str = MANGAASSIST_SYSTEM_PROMPT
) -> list[ChatMessage]:
    """The conversation an evaluation prompt is sent as."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": item.prompt},
    ]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def generate_answers(
    label: str,
    generator: ChatGenerator,
    items: Sequence[EvalItem],
    *,
    batch_size: int = 8,
    system_prompt: str = MANGAASSIST_SYSTEM_PROMPT,
    progress: ProgressFn = _stderr,
) -> list[str]:
    """Ask ``generator`` every prompt, ``batch_size`` at a time, reporting progress."""
    if batch_size < 1:
        raise ValueError(f"batch_size: {batch_size} is not accepted; use 1 or more")
    answers: list[str] = []
    started = time.monotonic()
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        produced = generator.generate([eval_conversation(item, system_prompt) for item in batch])
        if len(produced) != len(batch):
            raise RuntimeError(
                f"{label}: generator returned {len(produced)} answers for {len(batch)} prompts"
            )
        answers.extend(produced)
        done = len(answers)
        progress(
            f"[evaluate] {label}: {done}/{len(items)} prompts ({time.monotonic() - started:.1f} s)"
        )
    return answers


def run_quality_gate(
    items: Sequence[EvalItem],
    catalog: TitleCatalog,
    *,
    baseline: ChatGenerator,
    quantized: ChatGenerator,
    memory: MemoryFigures,
    thresholds: GateThresholds | None = None,
    batch_size: int = 8,
    progress: ProgressFn = _stderr,
    context: dict[str, object] | None = None,
) -> GateReport:
    """Generate with both models, score, and decide."""
    reports = {}
    for label, generator in (("baseline", baseline), ("quantized", quantized)):
        answers = generate_answers(
            label, generator, items, batch_size=batch_size, progress=progress
        )
        release = getattr(generator, "release", None)
        if callable(release):
            release()
        reports[label] = aggregate_scores(label, score_responses(items, answers, catalog), answers)
    return decide(reports["baseline"], reports["quantized"], memory, thresholds, context=context)


def write_responses(path: Path, item_ids: Sequence[str], answers: Sequence[str]) -> None:
    """Write answers as JSONL rows ``{"id", "response"}`` (what ``--*-responses`` reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        json.dumps({"id": item_id, "response": answer}, ensure_ascii=False)
        for item_id, answer in zip(item_ids, answers, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def write_reports(report: GateReport, report_dir: Path) -> tuple[Path, Path]:
    """Write ``quality_gate.json``, ``quality_gate.md`` and both models' answers."""
    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / "quality_gate.json"
    markdown_path = report_dir / "quality_gate.md"
    json_path.write_text(
        json.dumps(report_to_dict(report), ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    markdown_path.write_text(render_markdown(report), encoding="utf-8")
    for scores in (report.baseline, report.quantized):
        write_responses(
            report_dir / f"responses_{scores.label}.jsonl",
            [score.item_id for score in scores.items],
            scores.responses,
        )

    return json_path, markdown_path


def build_generator(kind: str, model_dir: Path, *, max_new_tokens: int) -> ChatGenerator:
    """The real generator for ``model_dir`` (imports torch/transformers/vLLM only here)."""
    from quantization import generation

    if kind == "transformers":
        return generation.TransformersChatGenerator(model_dir, max_new_tokens=max_new_tokens)
    if kind == "vllm":
        return generation.VllmChatGenerator(model_dir, max_new_tokens=max_new_tokens)
    raise ValueError(f"generator: {kind!r} is not accepted; use transformers or vllm")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m quantization.evaluate",
        description="Score baseline and AWQ-quantized models on the manga evaluation set and "
        "gate the quantized one (exit 0 pass, 1 fail, 2 bad input).",
    )
    parser.add_argument("--baseline-model", type=Path, help="bf16 model directory")
    parser.add_argument("--quantized-model", type=Path, help="AWQ model directory")
    parser.add_argument(
        "--generate-only",
        choices=("baseline", "quantized"),
        help="only write that model's answers (responses_<model>.jsonl in --report-dir), for "
        "engines that must run one model per process (vLLM); gate later with --*-responses",
    )
    parser.add_argument("--eval-set", type=Path, default=DEFAULT_EVAL_SET)
    parser.add_argument("--titles", type=Path, default=DEFAULT_TITLES, help="known-title catalogue")
    parser.add_argument("--generator", choices=("transformers", "vllm"), default="transformers")
    recorded_help = "JSONL rows {id, response}: answers to score instead of generating"
    parser.add_argument("--baseline-responses", type=Path, help=recorded_help)
    parser.add_argument("--quantized-responses", type=Path, help=recorded_help)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--report-dir", type=Path, default=Path("quality_gate"))
    parser.add_argument("--min-score", type=float, default=GateThresholds.min_score)
    parser.add_argument(
        "--max-regression",
        type=float,
        default=GateThresholds.max_regression,
        help="fraction, 0.02 = 2 %%",
    )
    parser.add_argument(
        "--min-memory-reduction",
        type=float,
        default=GateThresholds.min_memory_reduction,
        help="fraction, 0.6 = 60 %%",
    )
    return parser


def _generator_for(
    args: argparse.Namespace, label: str, items: Sequence[EvalItem]
) -> ChatGenerator:
    recorded = getattr(args, f"{label}_responses")
    if recorded:
        return RecordedResponses.from_jsonl(recorded, items)
    model_dir = getattr(args, f"{label}_model")
    return LazyGenerator(
        functools.partial(
            build_generator, args.generator, model_dir, max_new_tokens=args.max_new_tokens
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        thresholds = GateThresholds(
            min_score=args.min_score,
            max_regression=args.max_regression,
            min_memory_reduction=args.min_memory_reduction,
        )
        if args.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: {args.max_new_tokens} is not accepted; use 1+")
        needed = [args.generate_only] if args.generate_only else ["baseline", "quantized"]
        for label in needed:
            if getattr(args, f"{label}_model") is None:
                raise ValueError(f"--{label}-model: required (a model directory)")
        catalog = load_title_catalog(args.titles)
        items = load_eval_set(args.eval_set, catalog)
        if args.generate_only:
            model_dir = getattr(args, f"{args.generate_only}_model")
            measure_checkpoint_weights(model_dir)  # fail fast on a directory without weights
            generator = _generator_for(args, args.generate_only, items)
        else:
            memory = MemoryFigures(
                baseline_bytes=measure_checkpoint_weights(args.baseline_model).tensor_bytes,
                quantized_bytes=measure_checkpoint_weights(args.quantized_model).tensor_bytes,
            )
            generators = {label: _generator_for(args, label, items) for label in needed}
    except (DatasetError, CheckpointError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ja_count = sum(item.language == "ja" for item in items)
    _stderr(f"[evaluate] {len(items)} prompts (ja {ja_count}, en {len(items) - ja_count})")
    if args.generate_only:
        answers = generate_answers(args.generate_only, generator, items, batch_size=args.batch_size)
        path = args.report_dir / f"responses_{args.generate_only}.jsonl"
        write_responses(path, [item.item_id for item in items], answers)
        _stderr(f"[evaluate] {args.generate_only} answers: {path}")
        return 0
    report = run_quality_gate(
        items,
        catalog,
        baseline=generators["baseline"],
        quantized=generators["quantized"],
        memory=memory,
        thresholds=thresholds,
        batch_size=args.batch_size,
        context={
            "baseline_model": str(args.baseline_model),
            "quantized_model": str(args.quantized_model),
            "eval_set": str(args.eval_set),
            "baseline_answers": str(args.baseline_responses or args.generator),
            "quantized_answers": str(args.quantized_responses or args.generator),
        },
    )
    json_path, markdown_path = write_reports(report, args.report_dir)
    print(render_markdown(report))
    _stderr(f"[evaluate] reports: {json_path} {markdown_path}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
