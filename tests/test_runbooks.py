"""The runbooks in docs/runbooks/ stay in step with the alarms, the metrics and the settings.

* every runbook an alarm links (rule ``runbook=`` fields and any ``RUNBOOK_BASE_URL/<file>`` in
  stacks/*.py) is a file in docs/runbooks/, and every rule the alarm modules can build is in the
  index table with its severity and runbook;
* every runbook is listed in the index, and every relative link resolves;
* every metric-like name in backticks is in the metrics contract, every settings path in
  backticks exists in the settings models, every ``GATEWAY_*``/``ENGINE_*`` variable exists in
  the gateway's settings.

No synth: the rules are built directly (they are plain dataclasses).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import metrics_contract as mc
from stacks import alarm_rules
from stacks.alarms import RUNBOOK_BASE_URL, AlarmRule
from stacks.settings import EndpointAlarmSettings, EnvironmentSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = REPO_ROOT / "docs" / "runbooks"
INDEX = RUNBOOKS / "README.md"
STACKS = REPO_ROOT / "stacks"

CONTRACT_NAMES = {spec.name for spec in mc.ALL_METRICS}
CONTRACT_DIMENSIONS = {key for spec in mc.ALL_METRICS for key in spec.dimensions}
NOT_METRICS = frozenset({
    # CamelCase words the runbooks quote that are not CloudWatch metrics: SageMaker endpoint
    # statuses, API response fields and AWS error names, and the conditions of Lambda's
    # invocation records. Anything else CamelCase in backticks must be a contract metric (or one
    # of its dimension names).
    "Updating", "RollingBack", "FailureReason", "MaxCapacity", "MinCapacity", "AccessDenied",
    "TooManyRequestsException", "RetriesExhausted", "EventAgeExceeded",
})
METRIC_LIKE = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")
SETTINGS_PATH = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*|\[\d+\])+$")
FILE_SUFFIXES = (".yaml", ".yml", ".json", ".py", ".md", ".txt", ".png")
ENV_VARIABLE = re.compile(r"^(?:GATEWAY|ENGINE)_[A-Z0-9_]*\*?$")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
FENCED_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")

# Arguments for the rule builders of stacks/alarm_rules.py, by parameter name.
RULE_ARGUMENTS: dict[str, Any] = {
    "settings": EndpointAlarmSettings(),
    "gpu_count": 1,
    "max_capacity": 20,
    "minutes": 15,
    "daily_minimum": 5,
}


def runbook_pages() -> list[Path]:
    return sorted(RUNBOOKS.glob("*.md"))


def inline_code(text: str) -> Iterator[str]:
    """Inline code spans outside fenced blocks."""
    yield from INLINE_CODE.findall(FENCED_BLOCK.sub("", text))


def all_rules() -> dict[str, list[AlarmRule]]:
    """Every rule every builder in stacks/alarm_rules.py makes, by builder name."""
    built: dict[str, list[AlarmRule]] = {}
    for name, function in vars(alarm_rules).items():
        if not (callable(function) and re.search(r"_rules?$", name)):
            continue
        if getattr(function, "__module__", None) != alarm_rules.__name__:
            continue
        parameters = inspect.signature(function).parameters
        unknown = [p for p in parameters if p not in RULE_ARGUMENTS]
        assert not unknown, f"teach test_runbooks how to call {name}: parameters {unknown}"
        result = function(**{p: RULE_ARGUMENTS[p] for p in parameters})
        built[name] = [result] if isinstance(result, AlarmRule) else list(result)
    return built


def linked_runbooks_in_stacks() -> dict[str, set[str]]:
    """Runbook files named in stacks/*.py: ``runbook="..."`` and ``RUNBOOK_BASE_URL}/...``."""
    found: dict[str, set[str]] = {}
    patterns = (re.compile(r"""runbook\s*=\s*["']([^"']+)["']"""),
                re.compile(r"RUNBOOK_BASE_URL\}?/([A-Za-z0-9_.-]+)"))
    for source in sorted(STACKS.glob("*.py")):
        text = source.read_text(encoding="utf-8")
        for pattern in patterns:
            for target in pattern.findall(text):
                found.setdefault(target, set()).add(source.name)
    return found


# --- alarms → runbooks -------------------------------------------------------------------------
def test_runbook_links_point_at_this_folder() -> None:
    assert RUNBOOK_BASE_URL.endswith("/docs/runbooks")


def test_every_runbook_a_stack_links_is_a_file() -> None:
    linked = linked_runbooks_in_stacks()
    # Not vacuous: the seven alarm families and the index are linked from the stacks.
    assert {"README.md", "oom-diagnosis.md", "breaker-open.md", "engine-restarts.md",
            "scaling-pinned-at-max.md", "release-calendar-lambda.md", "latency-slo.md",
            "release-window-rejections.md"} <= set(linked)
    missing = {target: sorted(files) for target, files in linked.items()
               if not (RUNBOOKS / target).is_file()}
    assert missing == {}, f"alarm descriptions link runbooks that do not exist: {missing}"


def test_every_rule_the_builders_make_links_an_existing_runbook() -> None:
    rules = all_rules()
    assert {"llm_alarm_rules", "intent_alarm_rules"} <= set(rules)
    for builder, built in rules.items():
        for rule in built:
            assert (RUNBOOKS / rule.runbook).is_file(), (
                f"{builder}: rule {rule.name} links {rule.runbook}, not in docs/runbooks/")
            assert rule.description().endswith(f"{RUNBOOK_BASE_URL}/{rule.runbook}")


def index_rows() -> dict[str, str]:
    """The index's alarm table: first cell (rule name in backticks) → the whole row."""
    rows: dict[str, str] = {}
    for line in INDEX.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and (match := re.fullmatch(r"`([^`]+)`", cells[0])):
            rows[match.group(1)] = line
    return rows


def test_the_index_maps_every_alarm_rule_to_its_runbook_and_severity() -> None:
    rows = index_rows()
    problems = []
    for builder, built in all_rules().items():
        for rule in built:
            row = rows.get(rule.name)
            if row is None:
                problems.append(f"{builder}: rule {rule.name} is not in the index table")
            elif f"({rule.runbook})" not in row or f"| {rule.severity} |" not in row:
                problems.append(f"{builder}: index row for {rule.name} must link "
                                f"{rule.runbook} with severity {rule.severity}: {row}")
    assert problems == []


# --- the folder itself -------------------------------------------------------------------------
def test_every_runbook_is_listed_in_the_index() -> None:
    index = INDEX.read_text(encoding="utf-8")
    pages = [page.name for page in runbook_pages() if page.name != "README.md"]
    assert len(pages) >= 5
    unlisted = [page for page in pages if f"]({page})" not in index]
    assert unlisted == [], f"runbooks missing from docs/runbooks/README.md: {unlisted}"


@pytest.mark.parametrize("page", runbook_pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in MARKDOWN_LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert broken == [], f"{page.name}: broken links {broken}"


# --- names the runbooks quote ------------------------------------------------------------------
def metric_like(text: str) -> list[str]:
    return [code for code in inline_code(text) if METRIC_LIKE.match(code)]


@pytest.mark.parametrize("page", runbook_pages(), ids=lambda p: p.name)
def test_backticked_metric_names_are_in_the_contract(page: Path) -> None:
    names = metric_like(page.read_text(encoding="utf-8"))
    allowed = CONTRACT_NAMES | CONTRACT_DIMENSIONS | NOT_METRICS
    unknown = sorted({name for name in names if name not in allowed})
    assert unknown == [], (f"{page.name}: {unknown} look like metrics but are not in "
                           "metrics_contract (a typo, or add them to NOT_METRICS with a reason)")


def test_the_runbooks_quote_the_metrics_they_are_about() -> None:
    quoted = {n for page in runbook_pages()
              for n in metric_like(page.read_text(encoding="utf-8"))}
    assert {"OOMCircuitTrips", "EngineRestarts", "Fallbacks", "KVCacheUsage",
            "GPUMemoryUtilization", "QueueWait", "ModelLatency", "Invocation5XXErrors",
            "CalendarEntriesSkipped", "Errors", "AdmissionRejections", "TimeToFirstToken",
            "TimePerOutputToken", "MinCapacityInForce"} <= quoted


def settings_path_problem(path: str) -> str | None:
    """None when ``path`` (``llm.engine.max_num_seqs``, ``llm.adapters[0].rank``) exists."""
    current: Any = EnvironmentSettings
    walked: list[str] = []
    for part in re.findall(r"[a-z][a-z0-9_]*|\[\d+\]", path):
        if part.startswith("["):
            continue  # list index: the annotation's model is already current
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return f"{'.'.join(walked)} is a value, it has no field {part!r}"
        field = current.model_fields.get(part)
        if field is None:
            accepted = ", ".join(sorted(current.model_fields))
            return f"{'.'.join(walked) or 'settings'} has no field {part!r}; fields: {accepted}"
        walked.append(part)
        current = _model_in(field.annotation) or field.annotation
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in getattr(annotation, "__args__", ()) or ():
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def settings_paths(text: str) -> list[str]:
    top_level = set(EnvironmentSettings.model_fields)
    return [code for code in inline_code(text)
            if SETTINGS_PATH.match(code) and code.split(".")[0].split("[")[0] in top_level
            and not code.endswith(FILE_SUFFIXES)]


@pytest.mark.parametrize("page", runbook_pages(), ids=lambda p: p.name)
def test_backticked_settings_paths_exist(page: Path) -> None:
    problems = {path: problem for path in settings_paths(page.read_text(encoding="utf-8"))
                if (problem := settings_path_problem(path)) is not None}
    assert problems == {}, f"{page.name}: settings paths that do not exist: {problems}"


def test_the_settings_check_tells_real_paths_from_typos() -> None:
    assert settings_path_problem("llm.engine.max_num_seqs") is None
    assert settings_path_problem("llm.adapters[0].rank") is None
    assert settings_path_problem("llm.scaling.release_calendar.enabled") is None
    assert "has no field 'max_num_seq'" in str(settings_path_problem("llm.engine.max_num_seq"))
    assert "is a value" in str(settings_path_problem("llm.max_model_len.tokens"))
    used = {path for page in runbook_pages()
            for path in settings_paths(page.read_text(encoding="utf-8"))}
    assert {"llm.engine.max_num_seqs", "llm.max_model_len", "llm.engine.gpu_memory_utilization",
            "llm.scaling.max_capacity", "release_calendar.file"} <= used


@pytest.mark.parametrize("page", runbook_pages(), ids=lambda p: p.name)
def test_backticked_container_variables_exist(page: Path) -> None:
    from gateway.settings import SETTING_SPECS

    known = {spec.env for spec in SETTING_SPECS}
    unknown = []
    for code in inline_code(page.read_text(encoding="utf-8")):
        if not ENV_VARIABLE.match(code):
            continue
        if code.endswith("*"):
            if not any(name.startswith(code[:-1]) for name in known):
                unknown.append(code)
        elif code not in known:
            unknown.append(code)
    assert unknown == [], f"{page.name}: no such gateway/engine variable: {unknown}"
