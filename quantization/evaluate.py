"""Quality gate CLI: score the baseline and the quantized model, measure both, pass or fail.

    python -m quantization.evaluate --baseline-model BASE_DIR --quantized-model QUANT_DIR \\
        [--adapter manga=ADAPTERS/manga_domain ...] [--generator transformers|vllm] \\
        [--report-dir quality_gate/]

Each ``--adapter NAME=DIR`` (a PEFT LoRA folder) gets a section of its own: base+adapter in fp16
against AWQ-base+adapter on the adapter's own evaluation set (quantization/adapters.py says
which; ``--adapter-eval-set NAME=FILE`` overrides), with the base's scoring and thresholds. The
candidate passes only if the base model and every adapter pass.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from artifact_manifest import adapter_dir_checksum
from prompts import MANGAASSIST_SYSTEM_PROMPT
from quantization.adapters import (
    AdapterError,
    default_eval_set,
    parse_named,
    read_adapter_config,
)
from quantization.calibration import (
    SUPPORTED_LANGUAGES,
    ChatMessage,
    DatasetError,
    parse_jsonl_objects,
)
from quantization.checkpoint import CheckpointError, measure_checkpoint_weights
from quantization.gate import (
    AdapterGate,
    CandidateReport,
    GateReport,
    GateThresholds,
    MemoryFigures,
    ModelScores,
    aggregate_scores,
    candidate_to_dict,
    decide,
    render_candidate_markdown,
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
BASE_SECTION = ""
"""The section key of the base model (no adapter) in recorded answers."""

Conversation = Sequence[ChatMessage]
ProgressFn = Callable[[str], None]


class ChatGenerator(Protocol):
    """Answers a batch of conversations, one answer per conversation, in order."""

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Generate the assistant's next message for each conversation."""
        ...


class AdapterGenerator(ChatGenerator, Protocol):
    """A generator that can answer through a LoRA adapter (the gate's adapter sections)."""

    def use_adapter(self, name: str | None, adapter_dir: Path | None) -> None:
        """Answer through this adapter from now on (None: the base model alone)."""
        ...


class PerConversationGenerator:
    """Adapts a one-conversation function (``messages -> answer``) to :class:`ChatGenerator`;
    ``generate_one`` also receives the adapter in use (None: the base model)."""

    def __init__(self, generate_one: Callable[[Conversation], str],
                 with_adapter: Callable[[Conversation, str], str] | None = None) -> None:
        self._generate_one = generate_one
        self._with_adapter = with_adapter
        self._adapter: str | None = None

    def use_adapter(self, name: str | None, adapter_dir: Path | None) -> None:
        """Route the next conversations to ``with_adapter`` (None: back to ``generate_one``)."""
        if name is not None and self._with_adapter is None:
            raise ValueError(f"adapter {name!r}: this generator answers without adapters only")
        self._adapter = name

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Call the wrapped function once per conversation."""
        if self._adapter is not None and self._with_adapter is not None:
            name = self._adapter
            return [self._with_adapter(conversation, name) for conversation in conversations]
        return [self._generate_one(conversation) for conversation in conversations]


class LazyGenerator:
    """Builds its generator on first use and can drop it again.

    The gate runs one model at a time: an 8B baseline in bf16 and the quantized model
    (decompressed by transformers) do not fit on one 24 GiB GPU together.
    """

    def __init__(self, factory: Callable[[], AdapterGenerator]) -> None:
        self._factory = factory
        self._generator: AdapterGenerator | None = None
        self._adapter: tuple[str | None, Path | None] = (None, None)

    def _built(self) -> AdapterGenerator:
        if self._generator is None:
            self._generator = self._factory()
            if self._adapter[0] is not None:
                self._generator.use_adapter(*self._adapter)
        return self._generator

    def use_adapter(self, name: str | None, adapter_dir: Path | None) -> None:
        """Switch the adapter (applied when the model is built, if it is not yet)."""
        self._adapter = (name, adapter_dir)
        if self._generator is not None:
            self._generator.use_adapter(name, adapter_dir)

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Build the generator if needed, then delegate."""
        return self._built().generate(conversations)

    def release(self) -> None:
        """Drop the model and return its accelerator memory."""
        self._generator = None
        self._adapter = (None, None)
        from quantization.generation import release_accelerator_memory

        release_accelerator_memory()


class RecordedResponses:
    """Answers generated earlier, read from JSONL rows ``{"id", "response"}`` (the base model)
    and ``{"id", "response", "adapter"}`` (through that adapter)."""

    def __init__(self, responses: dict[tuple[str, str], str],
                 sections: dict[str, Sequence[EvalItem]]) -> None:
        self._by_prompt: dict[tuple[str, str], str] = {}
        for section, items in sections.items():
            missing = [item.item_id for item in items if (section, item.item_id) not in responses]
            if missing:
                through = f" through adapter {section!r}" if section else ""
                raise DatasetError(f"responses: no answer{through} for item(s) "
                                   f"{', '.join(missing)}")
            self._by_prompt.update({(section, item.prompt): responses[(section, item.item_id)]
                                    for item in items})
        self._section = BASE_SECTION

    @classmethod
    def from_jsonl(cls, path: Path, sections: dict[str, Sequence[EvalItem]]
                   ) -> RecordedResponses:
        """Load a responses file written by this CLI (or by any generator)."""
        found: dict[tuple[str, str], str] = {}
        with path.open(encoding="utf-8") as handle:
            for where, obj in parse_jsonl_objects(handle, source=str(path)):
                item_id, response = obj.get("id"), obj.get("response")
                adapter = obj.get("adapter", BASE_SECTION)
                if not isinstance(item_id, str) or not isinstance(response, str) \
                        or not isinstance(adapter, str):
                    raise DatasetError(f"{where}: needs string fields 'id' and 'response' (and "
                                       "'adapter', if any)")
                found[(adapter, item_id)] = response
        return cls(found, sections)

    def use_adapter(self, name: str | None, adapter_dir: Path | None) -> None:
        """Answer from the rows recorded through adapter ``name`` (None: the base model's)."""
        self._section = name or BASE_SECTION

    def generate(self, conversations: Sequence[Conversation]) -> list[str]:
        """Look each conversation's answer up by its user prompt."""
        return [self._by_prompt[(self._section, conversation[-1]["content"])]
                for conversation in conversations]


@dataclass(frozen=True)
class AdapterUnderTest:
    """One adapter the gate evaluates: its served name, folder, set and checksum."""

    name: str
    path: Path
    eval_set: Path
    items: tuple[EvalItem, ...]
    sha256: str

    @classmethod
    def load(cls, name: str, path: Path, eval_set: Path, catalog: TitleCatalog
             ) -> AdapterUnderTest:
        """Check the folder is a LoRA adapter, read its set and compute its checksum."""
        read_adapter_config(path)
        return cls(name=name, path=path, eval_set=eval_set,
                   items=tuple(load_eval_set(eval_set, catalog)),
                   sha256=adapter_dir_checksum(path))


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


def answer_sections(
    label: str,
    generator: ChatGenerator,
    items: Sequence[EvalItem],
    adapters: Sequence[AdapterUnderTest] = (),
    *,
    batch_size: int = 8,
    progress: ProgressFn = _stderr,
) -> dict[str, list[str]]:
    """One model's answers: the base set without an adapter, then each adapter's own set
    through it (section key: the adapter's name; the base's is ``""``)."""
    answers = {BASE_SECTION: generate_answers(label, generator, items, batch_size=batch_size,
                                              progress=progress)}
    if adapters:
        use_adapter = getattr(generator, "use_adapter", None)
        if not callable(use_adapter):
            raise ValueError(f"{label}: this generator cannot answer through an adapter")
        for adapter in adapters:
            use_adapter(adapter.name, adapter.path)
            answers[adapter.name] = generate_answers(
                f"{label}+{adapter.name}", generator, adapter.items, batch_size=batch_size,
                progress=progress)
        use_adapter(None, None)
    release = getattr(generator, "release", None)
    if callable(release):
        release()
    return answers


def run_candidate_gate(
    items: Sequence[EvalItem],
    catalog: TitleCatalog,
    *,
    baseline: ChatGenerator,
    quantized: ChatGenerator,
    memory: MemoryFigures,
    adapters: Sequence[AdapterUnderTest] = (),
    thresholds: GateThresholds | None = None,
    batch_size: int = 8,
    progress: ProgressFn = _stderr,
    context: dict[str, object] | None = None,
    base_eval_set: str = "",
) -> CandidateReport:
    """Generate with both models (base, then through each adapter), score, and decide each
    section: the base model's on ``items``, each adapter's on its own set."""
    answers = {label: answer_sections(label, generator, items, adapters,
                                      batch_size=batch_size, progress=progress)
               for label, generator in (("baseline", baseline), ("quantized", quantized))}

    def scores(label: str, section: str, section_items: Sequence[EvalItem],
               languages: Sequence[str] | None) -> ModelScores:
        texts = answers[label][section]
        return aggregate_scores(label, score_responses(section_items, texts, catalog), texts,
                                languages=languages)

    base = decide(scores("baseline", BASE_SECTION, items, SUPPORTED_LANGUAGES),
                  scores("quantized", BASE_SECTION, items, SUPPORTED_LANGUAGES),
                  memory, thresholds, context=context)
    sections = tuple(
        AdapterGate(
            name=adapter.name, directory=adapter.path.name, sha256=adapter.sha256,
            eval_set=adapter.eval_set.name,
            report=decide(scores("baseline", adapter.name, adapter.items, None),
                          scores("quantized", adapter.name, adapter.items, None), None,
                          thresholds, context={"adapter": str(adapter.path),
                                               "eval_set": str(adapter.eval_set)}))
        for adapter in adapters)
    return CandidateReport(base=base, adapters=sections, base_eval_set=base_eval_set)


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
    """The base model's section alone (no adapter): generate with both models, score, decide."""
    return run_candidate_gate(items, catalog, baseline=baseline, quantized=quantized,
                              memory=memory, thresholds=thresholds, batch_size=batch_size,
                              progress=progress, context=context).base


def write_responses(path: Path, item_ids: Sequence[str], answers: Sequence[str],
                    *, adapters: dict[str, tuple[Sequence[str], Sequence[str]]] | None = None
                    ) -> None:
    """Write answers as JSONL rows ``{"id", "response"}`` (what ``--*-responses`` reads), then
    each adapter's as ``{"id", "response", "adapter"}`` (``adapters``: name -> ids, answers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        json.dumps({"id": item_id, "response": answer}, ensure_ascii=False)
        for item_id, answer in zip(item_ids, answers, strict=True)
    ]
    for name, (ids, texts) in (adapters or {}).items():
        rows += [json.dumps({"id": item_id, "response": answer, "adapter": name},
                            ensure_ascii=False)
                 for item_id, answer in zip(ids, texts, strict=True)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def write_reports(report: CandidateReport | GateReport, report_dir: Path) -> tuple[Path, Path]:
    """Write ``quality_gate.json``, ``quality_gate.md`` and both models' answers."""
    candidate = report if isinstance(report, CandidateReport) else CandidateReport(base=report)
    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / "quality_gate.json"
    markdown_path = report_dir / "quality_gate.md"
    json_path.write_text(json.dumps(candidate_to_dict(candidate), ensure_ascii=False, indent=2)
                         + "\n", encoding="utf-8")
    markdown_path.write_text(render_candidate_markdown(candidate), encoding="utf-8")
    for side in ("baseline", "quantized"):
        base: ModelScores = getattr(candidate.base, side)
        by_adapter = {gate.name: getattr(gate.report, side) for gate in candidate.adapters}
        write_responses(
            report_dir / f"responses_{base.label}.jsonl",
            [score.item_id for score in base.items], base.responses,
            adapters={name: ([score.item_id for score in scores.items], scores.responses)
                      for name, scores in by_adapter.items()})
    return json_path, markdown_path


def build_generator(kind: str, model_dir: Path, *, max_new_tokens: int) -> AdapterGenerator:
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
        description="Score baseline and AWQ-quantized models on the manga evaluation set, and "
        "each adapter on its own set through both, and gate the quantized one (exit 0 pass, "
        "1 fail, 2 bad input).",
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
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR",
                        help="a served LoRA adapter (PEFT folder) to gate on its own set "
                        "(repeatable; NAME as in llm.adapters)")
    parser.add_argument("--adapter-eval-set", action="append", default=[],
                        metavar="NAME=FILE", help="an adapter's evaluation set instead of its "
                        "default (quantization/adapters.py)")
    parser.add_argument("--titles", type=Path, default=DEFAULT_TITLES, help="known-title catalogue")
    parser.add_argument("--generator", choices=("transformers", "vllm"), default="transformers")
    recorded_help = ("JSONL rows {id, response[, adapter]}: answers to score instead of "
                     "generating")
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


def _generator_for(args: argparse.Namespace, label: str, items: Sequence[EvalItem],
                   adapters: Sequence[AdapterUnderTest]) -> ChatGenerator:
    recorded = getattr(args, f"{label}_responses")
    if recorded:
        sections: dict[str, Sequence[EvalItem]] = {BASE_SECTION: items}
        sections.update({adapter.name: adapter.items for adapter in adapters})
        return RecordedResponses.from_jsonl(recorded, sections)
    model_dir = getattr(args, f"{label}_model")
    return LazyGenerator(
        functools.partial(
            build_generator, args.generator, model_dir, max_new_tokens=args.max_new_tokens
        )
    )


def load_adapters(args: argparse.Namespace, catalog: TitleCatalog) -> list[AdapterUnderTest]:
    """``--adapter`` and ``--adapter-eval-set`` as the adapters to gate."""
    folders = parse_named(args.adapter, "--adapter")
    sets = parse_named(args.adapter_eval_set, "--adapter-eval-set")
    unknown = sorted(set(sets) - set(folders))
    if unknown:
        raise AdapterError(f"--adapter-eval-set: {unknown[0]!r} is not an --adapter; accepted: "
                           f"{', '.join(folders) or 'none given'}")
    return [AdapterUnderTest.load(name, Path(folder),
                                  Path(sets[name]) if name in sets else default_eval_set(name),
                                  catalog)
            for name, folder in folders.items()]


def _checked_inputs(args: argparse.Namespace) -> tuple[GateThresholds, TitleCatalog]:
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
        measure_checkpoint_weights(getattr(args, f"{label}_model"))  # fail fast: no weights
    return thresholds, load_title_catalog(args.titles)


def _generate_only(args: argparse.Namespace, generator: ChatGenerator,
                   items: Sequence[EvalItem], adapters: Sequence[AdapterUnderTest]) -> int:
    label = args.generate_only
    answers = answer_sections(label, generator, items, adapters, batch_size=args.batch_size)
    path = args.report_dir / f"responses_{label}.jsonl"
    write_responses(path, [item.item_id for item in items], answers[BASE_SECTION],
                    adapters={adapter.name: ([item.item_id for item in adapter.items],
                                             answers[adapter.name]) for adapter in adapters})
    _stderr(f"[evaluate] {label} answers: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        thresholds, catalog = _checked_inputs(args)
        items = load_eval_set(args.eval_set, catalog)
        adapters = load_adapters(args, catalog)
        needed = [args.generate_only] if args.generate_only else ["baseline", "quantized"]
        generators = {label: _generator_for(args, label, items, adapters) for label in needed}
    except (DatasetError, CheckpointError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ja_count = sum(item.language == "ja" for item in items)
    _stderr(f"[evaluate] {len(items)} prompts (ja {ja_count}, en {len(items) - ja_count})"
            + "".join(f"; adapter {a.name}: {len(a.items)} prompts ({a.eval_set.name})"
                      for a in adapters))
    if args.generate_only:
        return _generate_only(args, generators[args.generate_only], items, adapters)
    report = run_candidate_gate(
        items,
        catalog,
        baseline=generators["baseline"],
        quantized=generators["quantized"],
        memory=MemoryFigures(
            baseline_bytes=measure_checkpoint_weights(args.baseline_model).tensor_bytes,
            quantized_bytes=measure_checkpoint_weights(args.quantized_model).tensor_bytes),
        adapters=adapters,
        thresholds=thresholds,
        batch_size=args.batch_size,
        context={
            "baseline_model": str(args.baseline_model),
            "quantized_model": str(args.quantized_model),
            "eval_set": str(args.eval_set),
            "baseline_answers": str(args.baseline_responses or args.generator),
            "quantized_answers": str(args.quantized_responses or args.generator),
        },
        base_eval_set=args.eval_set.name,
    )
    json_path, markdown_path = write_reports(report, args.report_dir)
    print(render_candidate_markdown(report))
    _stderr(f"[evaluate] reports: {json_path} {markdown_path}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
