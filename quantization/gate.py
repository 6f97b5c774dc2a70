"""The quality gate: does the quantized model keep the baseline's quality at ≥ 60 % less memory?

The acceptance criteria (docs/design-decisions.md#awq-quality-gate), checked on the quantized
model against the baseline:

- score ≥ 4.0 / 5.0 overall, on Japanese prompts and on English prompts (each on its own);
- regression ≤ 2 % against the baseline, overall and per language
  (``(baseline − quantized) / baseline``; an improvement is a negative regression);
- zero hallucinated titles in the quantized model's answers;
- weight memory reduced by ≥ 60 % (safetensors tensor bytes, baseline vs quantized).

Every check is reported with what was measured and the threshold, so a failing report says why.
The baseline is not gated (it is the reference), but a baseline under the score threshold is
called out: then the evaluation set or the generation settings need attention, not the
quantization.

Pure module: standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from quantization.calibration import SUPPORTED_LANGUAGES
from quantization.resolution import RegressionInterval, regression_interval, smallest_step
from quantization.scoring import ResponseScore

RESPONSE_EXCERPT_CHARS = 240


@dataclass(frozen=True)
class GateThresholds:
    """The acceptance thresholds (docs/design-decisions.md#awq-quality-gate)."""

    min_score: float = 4.0
    max_regression: float = 0.02
    max_hallucinated_titles: int = 0
    min_memory_reduction: float = 0.60

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_score <= 5.0:
            raise ValueError(f"min_score: {self.min_score} is not on the 0–5 scale")
        if not 0.0 <= self.max_regression < 1.0:
            raise ValueError(f"max_regression: {self.max_regression} must be in [0, 1)")
        if self.max_hallucinated_titles < 0:
            raise ValueError(f"max_hallucinated_titles: {self.max_hallucinated_titles} < 0")
        if not 0.0 <= self.min_memory_reduction < 1.0:
            raise ValueError(f"min_memory_reduction: {self.min_memory_reduction} must be in [0, 1)")


@dataclass(frozen=True)
class ModelScores:
    """One model's scores: overall, per language, per item, and every hallucinated title."""

    label: str
    overall: float
    by_language: dict[str, float]
    items_by_language: dict[str, int]
    items: tuple[ResponseScore, ...]
    responses: tuple[str, ...]

    @property
    def hallucinations(self) -> list[tuple[str, str]]:
        """``(item id, title)`` for every invented title."""
        return [(s.item_id, title) for s in self.items for title in s.hallucinated_titles]

    def score(self, dimension: str) -> float:
        """``overall`` or a language code."""
        return self.overall if dimension == "overall" else self.by_language[dimension]

    @property
    def dimensions(self) -> tuple[str, ...]:
        """``overall``, then each language this model was scored on."""
        return ("overall", *self.by_language)


def aggregate_scores(
    label: str,
    scores: Sequence[ResponseScore],
    responses: Sequence[str],
    *,
    languages: Sequence[str] | None = SUPPORTED_LANGUAGES,
) -> ModelScores:
    """Mean scores overall and per language. Each of ``languages`` must have at least one item
    (the base set is scored in Japanese and English separately); ``None``: the languages the
    items have (an adapter's set may be in one language, e.g. ``manga-ja``'s)."""
    if not scores:
        raise ValueError(f"{label}: no scored answers")
    present = {s.language for s in scores}
    wanted = (languages if languages is not None
              else [language for language in SUPPORTED_LANGUAGES if language in present])
    by_language: dict[str, float] = {}
    counts: dict[str, int] = {}
    for language in wanted:
        subset = [s.score for s in scores if s.language == language]
        if not subset:
            raise ValueError(
                f"{label}: no {language!r} items; the gate scores Japanese and English separately"
            )
        by_language[language] = round(statistics.fmean(subset), 4)
        counts[language] = len(subset)
    return ModelScores(
        label=label,
        overall=round(statistics.fmean(s.score for s in scores), 4),
        by_language=by_language,
        items_by_language=counts,
        items=tuple(scores),
        responses=tuple(responses),
    )


@dataclass(frozen=True)
class GateCheck:
    """One acceptance criterion: what was measured against which threshold."""

    name: str
    passed: bool
    measured: float
    threshold: float
    comparison: str
    detail: str


@dataclass(frozen=True)
class MemoryFigures:
    """Weight memory of both checkpoints (tensor bytes from the safetensors headers)."""

    baseline_bytes: int
    quantized_bytes: int

    @property
    def reduction(self) -> float:
        """1 − quantized / baseline."""
        return 1.0 - self.quantized_bytes / self.baseline_bytes


@dataclass(frozen=True)
class GateReport:
    """The gate's decision and everything that led to it."""

    passed: bool
    checks: tuple[GateCheck, ...]
    baseline: ModelScores
    quantized: ModelScores
    memory: MemoryFigures | None
    """The checkpoints' weight memory (None in an adapter's section: the base's section has it)."""
    thresholds: GateThresholds
    warnings: tuple[str, ...] = ()
    context: dict[str, object] = field(default_factory=dict)

    @property
    def failures(self) -> list[GateCheck]:
        """The checks that failed."""
        return [check for check in self.checks if not check.passed]


def regression(baseline: float, quantized: float) -> float:
    """Relative quality loss: (baseline − quantized) / baseline; 0 when the baseline is 0."""
    return 0.0 if baseline <= 0 else (baseline - quantized) / baseline


def score_checks(baseline: ModelScores, quantized: ModelScores,
                 limits: GateThresholds) -> tuple[list[GateCheck], list[str]]:
    """Per dimension: the quantized score's floor, then its regression from the baseline; with
    a warning for each dimension the baseline scored 0 on."""
    if baseline.dimensions != quantized.dimensions:
        raise ValueError(f"baseline scored on {', '.join(baseline.dimensions)} but quantized on "
                         f"{', '.join(quantized.dimensions)}: both must answer the same set")
    checks: list[GateCheck] = []
    warnings: list[str] = []
    for dimension in baseline.dimensions:
        score = quantized.score(dimension)
        checks.append(
            GateCheck(
                name=f"score_{dimension}",
                passed=score >= limits.min_score,
                measured=score,
                threshold=limits.min_score,
                comparison=">=",
                detail=f"quantized {dimension} score {score:.2f}/5.00",
            )
        )
    for dimension in baseline.dimensions:
        base, quant = baseline.score(dimension), quantized.score(dimension)
        loss = regression(base, quant)
        if base <= 0:
            warnings.append(f"baseline scored 0 on {dimension}: regression is not meaningful")
        checks.append(
            GateCheck(
                name=f"regression_{dimension}",
                passed=loss <= limits.max_regression,
                measured=round(loss, 6),
                threshold=limits.max_regression,
                comparison="<=",
                detail=f"{dimension}: baseline {base:.2f} → quantized {quant:.2f} "
                f"({0.0 - loss * 100 + 0.0:+.2f} %)",
            )
        )
    return checks, warnings


def decide(
    baseline: ModelScores,
    quantized: ModelScores,
    memory: MemoryFigures | None,
    thresholds: GateThresholds | None = None,
    *,
    context: dict[str, object] | None = None,
) -> GateReport:
    """Apply every acceptance criterion and return the report (``memory`` None: an adapter's
    section, whose checkpoint is the base's, so no memory check)."""
    limits = thresholds or GateThresholds()
    if memory is not None and memory.baseline_bytes <= 0:
        raise ValueError(f"baseline_bytes: {memory.baseline_bytes} is not a weight size")
    checks, warnings = score_checks(baseline, quantized, limits)
    invented = quantized.hallucinations
    checks.append(
        GateCheck(
            name="hallucinated_titles",
            passed=len(invented) <= limits.max_hallucinated_titles,
            measured=len(invented),
            threshold=limits.max_hallucinated_titles,
            comparison="<=",
            detail=", ".join(f"{item}: {title}" for item, title in invented) or "none",
        )
    )
    if memory is not None:
        checks.append(memory_check(memory, limits))
    for dimension in baseline.dimensions:
        if baseline.score(dimension) < limits.min_score:
            warnings.append(
                f"baseline {dimension} score {baseline.score(dimension):.2f} is below "
                f"{limits.min_score:.1f}: check the evaluation set and generation settings"
            )
    if baseline.hallucinations:
        warnings.append(f"baseline invented {len(baseline.hallucinations)} title(s) too")
    warnings += resolution_warnings(baseline, quantized, limits.max_regression)
    return GateReport(
        passed=all(check.passed for check in checks),
        checks=tuple(checks),
        baseline=baseline,
        quantized=quantized,
        memory=memory,
        thresholds=limits,
        warnings=tuple(warnings),
        context=dict(context or {}),
    )


def memory_check(memory: MemoryFigures, limits: GateThresholds) -> GateCheck:
    """The weight memory reduction against its floor."""
    reduction = memory.reduction
    return GateCheck(
        name="memory_reduction",
        passed=reduction >= limits.min_memory_reduction,
        measured=round(reduction, 6),
        threshold=limits.min_memory_reduction,
        comparison=">=",
        detail=f"{_gib(memory.baseline_bytes)} → {_gib(memory.quantized_bytes)} "
        f"({reduction * 100:.1f} % less)",
    )


def paired_interval(baseline: ModelScores, quantized: ModelScores,
                    dimension: str) -> RegressionInterval | None:
    """The 95 % interval of one dimension's regression, over the prompts both models answered
    (quantization/resolution.py)."""
    quantized_by_id = {s.item_id: s.score for s in quantized.items}
    pairs = [(s.score, quantized_by_id[s.item_id]) for s in baseline.items
             if s.item_id in quantized_by_id and dimension in ("overall", s.language)]
    return regression_interval([b for b, _ in pairs], [q for _, q in pairs])


def resolution_warnings(baseline: ModelScores, quantized: ModelScores,
                        max_regression: float) -> list[str]:
    """Where this run's answers vary too much for its prompts to resolve the threshold."""
    warnings = []
    for dimension in baseline.dimensions:
        interval = paired_interval(baseline, quantized, dimension)
        if interval is not None and interval.half_width > max_regression:
            warnings.append(
                f"regression_{dimension}: {interval.regression * 100:+.2f} % ± "
                f"{interval.half_width * 100:.2f} % (95 % interval over {interval.prompts} "
                f"paired prompts): this set cannot resolve the {max_regression * 100:g} % "
                "threshold (docs/design-decisions.md#gate-resolution)")
    return warnings


def resolution_lines(report: GateReport) -> list[str]:
    """What this section's set can and cannot resolve, per dimension: its paired prompts, the
    smallest regression one lost item registers as, and this run's 95 % interval."""
    threshold = report.thresholds.max_regression
    lines = []
    for dimension in report.baseline.dimensions:
        scored = [s for s in report.baseline.items if dimension in ("overall", s.language)]
        base = report.baseline.score(dimension)
        if not scored or base <= 0:
            lines.append(f"{dimension}: baseline 0, nothing to resolve")
            continue
        items = statistics.median(len(s.found) + len(s.missing) for s in scored)
        step = smallest_step(len(scored), max(1, round(items)), base)
        interval = paired_interval(report.baseline, report.quantized, dimension)
        spread = "" if interval is None else f", this run ± {interval.half_width * 100:.2f} %"
        can = step <= threshold and (interval is None or interval.half_width <= threshold)
        lines.append(
            f"{dimension}: {len(scored)} prompts; one lost item (of {items:g}) on one prompt is "
            f"{step * 100:.2f} %{spread}: "
            + (f"resolves the {threshold * 100:g} % threshold" if can else
               f"cannot resolve the {threshold * 100:g} % threshold, only a pass with no item "
               "lost or a regression well beyond it (docs/design-decisions.md#gate-resolution)"))
    return lines


def _gib(num_bytes: int) -> str:
    if num_bytes >= 1024**3:
        return f"{num_bytes / 1024**3:.2f} GiB"
    return f"{num_bytes / 1024**2:.2f} MiB"


# --- the candidate: the base model and each adapter ------------------------------------------


@dataclass(frozen=True)
class AdapterGate:
    """One adapter's section: base+adapter in fp16 against AWQ-base+adapter on its own set."""

    name: str
    directory: str
    """Its folder (``llm.adapters[].directory``: ``adapters/<directory>/`` in the model data)."""
    sha256: str
    """The adapter's checksum (quantization/adapters.py): what the candidate was gated with."""
    eval_set: str
    report: GateReport


@dataclass(frozen=True)
class CandidateReport:
    """The gate's verdict on a candidate: the base model's section and one per adapter."""

    base: GateReport
    adapters: tuple[AdapterGate, ...] = ()
    base_eval_set: str = ""

    @property
    def passed(self) -> bool:
        """The base and every adapter passed."""
        return self.base.passed and all(adapter.report.passed for adapter in self.adapters)

    @property
    def failures(self) -> list[tuple[str, GateCheck]]:
        """``(check name, check)`` of every failed check: the base's as they are, an adapter's
        as ``<adapter>:<check>``."""
        failed = [(check.name, check) for check in self.base.failures]
        for adapter in self.adapters:
            failed += [(f"{adapter.name}:{check.name}", check)
                       for check in adapter.report.failures]
        return failed


# --- reports ----------------------------------------------------------------------------------


def _model_dict(scores: ModelScores) -> dict[str, object]:
    return {
        "label": scores.label,
        "overall": scores.overall,
        "by_language": scores.by_language,
        "items_by_language": scores.items_by_language,
        "hallucinated_titles": [
            {"id": item, "title": title} for item, title in scores.hallucinations
        ],
        "items": [
            {**score.as_dict(), "response": response}
            for score, response in zip(scores.items, scores.responses, strict=True)
        ],
    }


def report_to_dict(report: GateReport) -> dict[str, object]:
    """One section's JSON: decision, checks, scores, memory (the base's) and every item."""
    section: dict[str, object] = {
        "passed": report.passed,
        "failed_checks": [check.name for check in report.failures],
        "checks": [check.__dict__ for check in report.checks],
        "thresholds": report.thresholds.__dict__,
    }
    if report.memory is not None:
        section["memory"] = {
            "baseline_weight_bytes": report.memory.baseline_bytes,
            "quantized_weight_bytes": report.memory.quantized_bytes,
            "reduction": round(report.memory.reduction, 6),
        }
    return {
        **section,
        "resolution": resolution_lines(report),
        "baseline": _model_dict(report.baseline),
        "quantized": _model_dict(report.quantized),
        "warnings": list(report.warnings),
        "context": report.context,
    }


def candidate_to_dict(candidate: CandidateReport) -> dict[str, object]:
    """``quality_gate.json``: the base's section at the top level (``passed`` and
    ``failed_checks`` for the whole candidate, ``base_passed`` for the base alone) and
    ``adapters``: one section per adapter by name, with its checksum and evaluation set."""
    base = report_to_dict(candidate.base)
    return {
        **base,
        "passed": candidate.passed,
        "failed_checks": [name for name, _ in candidate.failures],
        "base_passed": candidate.base.passed,
        "eval_set": candidate.base_eval_set,
        "adapters": {
            adapter.name: {"directory": adapter.directory, "sha256": adapter.sha256,
                           "eval_set": adapter.eval_set,
                           **report_to_dict(adapter.report)}
            for adapter in candidate.adapters
        },
    }


def _excerpt(text: str) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= RESPONSE_EXCERPT_CHARS else flat[:RESPONSE_EXCERPT_CHARS] + " …"


def _score_lines(report: GateReport, heading: str) -> list[str]:
    dimensions = report.baseline.dimensions
    lines = [f"{heading} Scores (0–5)", "", "| | " + " | ".join(dimensions) + " |",
             "|---|" + "---|" * len(dimensions)]
    for scores in (report.baseline, report.quantized):
        lines.append(f"| {scores.label} | "
                     + " | ".join(f"{scores.score(d):.2f}" for d in dimensions) + " |")
    lines.append("| regression | " + " | ".join(
        f"{regression(report.baseline.score(d), report.quantized.score(d)) * 100:.2f} %"
        for d in dimensions) + " |")
    counts = report.quantized.items_by_language
    named = {"ja": "Japanese", "en": "English"}
    lines += ["", "Items: " + ", ".join(f"{count} {named.get(language, language)}"
                                        for language, count in counts.items()) + ".", "",
              "What this set can resolve:", ""]
    lines.extend(f"- {line}" for line in resolution_lines(report))
    return lines


def _weak_lines(report: GateReport, heading: str) -> list[str]:
    weak = [
        (score, response)
        for score, response in zip(report.quantized.items, report.quantized.responses, strict=True)
        if score.missing or score.hallucinated_titles
    ]
    if not weak:
        return []
    lines = ["", f"{heading} Quantized answers that lost points", "",
             "| id | lang | score | missing | hallucinated | answer |",
             "|---|---|---|---|---|---|"]
    lines.extend(
        f"| {s.item_id} | {s.language} | {s.score:.2f} | "
        f"{', '.join(s.missing).replace('|', '/') or '—'} | "
        f"{', '.join(s.hallucinated_titles) or '—'} | {_excerpt(text)} |"
        for s, text in weak
    )
    return lines


def section_markdown(report: GateReport, heading: str = "##") -> list[str]:
    """One section's body: scores, every check, weight memory, warnings, weak answers, run."""
    lines = _score_lines(report, heading)
    lines += ["", f"{heading} Checks", "", "| check | result | measured | threshold | detail |",
              "|---|---|---|---|---|"]
    lines.extend(
        f"| {c.name} | {'pass' if c.passed else 'FAIL'} | {c.measured:g} | {c.comparison} "
        f"{c.threshold:g} | {c.detail.replace('|', '/')} |"
        for c in report.checks
    )
    memory = report.memory
    if memory is not None:
        lines += [
            "", f"{heading} Weight memory", "",
            f"- baseline: {memory.baseline_bytes:,} bytes ({_gib(memory.baseline_bytes)})",
            f"- quantized: {memory.quantized_bytes:,} bytes ({_gib(memory.quantized_bytes)})",
            f"- reduction: {memory.reduction * 100:.1f} %",
        ]
    if report.warnings:
        lines += ["", f"{heading} Warnings", ""]
        lines.extend(f"- {warning}" for warning in report.warnings)
    lines += _weak_lines(report, heading)
    if report.context:
        lines += ["", f"{heading} Run", ""]
        lines.extend(f"- {key}: {value}" for key, value in report.context.items())
    return lines


def _verdict_lines(title: str, failures: Sequence[tuple[str, GateCheck]], passed: bool
                   ) -> list[str]:
    lines = [f"# {title}: {'PASSED' if passed else 'FAILED'}", ""]
    if failures:
        lines.append("Failed because:")
        lines.extend(f"- **{name}**: measured {check.measured:g}, needs {check.comparison} "
                     f"{check.threshold:g} — {check.detail}" for name, check in failures)
    else:
        lines.append("Every acceptance criterion holds.")
    return lines


def render_markdown(report: GateReport) -> str:
    """One section as a whole report: verdict and reasons first, then the section."""
    failures = [(check.name, check) for check in report.failures]
    lines = _verdict_lines("AWQ quality gate", failures, report.passed)
    return "\n".join([*lines, "", *section_markdown(report)]) + "\n"


def render_candidate_markdown(candidate: CandidateReport) -> str:
    """``quality_gate.md``: the verdict and every failed check first, a table of the sections,
    then the base model's section and one per adapter."""
    lines = _verdict_lines("AWQ quality gate", candidate.failures, candidate.passed)
    if not candidate.adapters:
        return "\n".join([*lines, "", *section_markdown(candidate.base)]) + "\n"
    lines += ["", "| section | evaluation set | prompts | verdict |", "|---|---|---|---|",
              f"| base model | {candidate.base_eval_set} | {len(candidate.base.quantized.items)} "
              f"| {'pass' if candidate.base.passed else 'FAIL'} |"]
    lines.extend(f"| adapter {a.name} (sha256 {a.sha256[:12]}…) | {a.eval_set} | "
                 f"{len(a.report.quantized.items)} | {'pass' if a.report.passed else 'FAIL'} |"
                 for a in candidate.adapters)
    lines += ["", "## Base model (fp16 vs AWQ, no adapter)", "",
              *section_markdown(candidate.base, "###")]
    for adapter in candidate.adapters:
        lines += ["", f"## Adapter {adapter.name} (fp16 base + adapter vs AWQ base + adapter)",
                  "", f"Checksum {adapter.sha256}; evaluation set {adapter.eval_set}.", "",
                  *section_markdown(adapter.report, "###")]
    return "\n".join(lines) + "\n"
