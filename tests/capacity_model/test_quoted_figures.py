"""Figures that docs, config comments and alarm text quote from the plan agree with the plan.

docs/capacity.md's plan blocks are checked line by line (test_docs_figures.py); these are the
figures quoted elsewhere, in prose: each is found by a pattern that names it and compared with
what the capacity model derives for production now, so a plan change that leaves one stale
fails here (issue 39 found docs/scaling.md, docs/operate.md, config/prod.yaml and
stacks/alarm_rules.py quoting an older plan)."""

from __future__ import annotations

import re

import pytest

from capacity_model import LlmCapacity
from stacks.settings import REPO_ROOT


def _text(path: str) -> str:
    return (REPO_ROOT / path).read_text(encoding="utf-8")


def _found(pattern: str, path: str) -> re.Match[str]:
    match = re.search(pattern, _text(path))
    assert match, f"{path} no longer quotes {pattern!r}: quote the figure or update this test"
    return match


def _required(prod: LlmCapacity, multiplier: float) -> int:
    return prod.fleet.calendar_model().required_instances(multiplier)


def test_scaling_md_calendar_inputs_are_the_plans(prod: LlmCapacity) -> None:
    fleet = prod.fleet
    per = _found(r"\| `per_instance_invocations_per_min` \| ([\d.]+) \|", "docs/scaling.md")
    assert float(per.group(1)) == pytest.approx(fleet.per_instance_invocations_per_min)
    night = _found(r"\| `off_peak` \| 01:00, min (\d+) max (\d+) \|", "docs/scaling.md")
    assert (int(night.group(1)), int(night.group(2))) == (fleet.off_peak.min_capacity,
                                                          fleet.off_peak.max_capacity)
    day = _found(r"\| `business_hours` \| 08:00, min (\d+) max (\d+) \|", "docs/scaling.md")
    assert (int(day.group(1)), int(day.group(2))) == (fleet.business_hours.min_capacity,
                                                      fleet.business_hours.max_capacity)


def test_scaling_md_release_pre_scales_are_the_calendars(prod: LlmCapacity) -> None:
    sentence = _found(r"(?s)So One Piece \(×3\.0\) pre-scales to.*?\.\s", "docs/scaling.md").group(0)
    pairs = re.findall(r"\(×(\d\.\d)\) (?:pre-scales |and the Friday window )?to (\d+)",
                       sentence.replace("\n", " "))
    assert len(pairs) == 4, sentence
    for multiplier, instances in pairs:
        assert int(instances) == _required(prod, float(multiplier)), (multiplier, sentence)


def test_the_maximum_in_force_quoted_by_night_and_day(prod: LlmCapacity) -> None:
    fleet = prod.fleet
    night, day = fleet.off_peak.max_capacity, fleet.business_hours.max_capacity
    operate = _found(r"\((\d+) at night in prod, (\d+) by day\)", "docs/operate.md")
    assert (int(operate.group(1)), int(operate.group(2))) == (night, day)
    alarm = _found(r"(\d+) between 01:00 and 08:00 Tokyo in production, (\d+) by day",
                   "stacks/alarm_rules.py")
    assert (int(alarm.group(1)), int(alarm.group(2))) == (night, day)
    scaling = _found(r"That maximum moves: (\d+) by day and (\d+) from 01:00", "docs/scaling.md")
    assert (int(scaling.group(2)), int(scaling.group(1))) == (night, day)
    header = _found(r"\| option \| night \((\d+)\) \|", "docs/scaling.md")
    assert int(header.group(1)) == night


def test_operate_md_prod_range_and_prod_yaml_one_piece(prod: LlmCapacity) -> None:
    fleet = prod.fleet
    prod_range = _found(r"\| LLM, Prod \| ml\.g5\.xlarge, (\d+)–(\d+) \|", "docs/operate.md")
    assert (int(prod_range.group(1)), int(prod_range.group(2))) == (fleet.min_capacity,
                                                                    fleet.max_capacity)
    one_piece = _found(r"One Piece \(×3\) needs (\d+) at the capacity model's rate",
                       "config/prod.yaml")
    assert int(one_piece.group(1)) == _required(prod, 3.0)
    assert _required(prod, 3.0) <= fleet.max_capacity


def test_capacity_md_quotes_the_plans_release_and_cap(prod: LlmCapacity) -> None:
    """The prose figures of docs/capacity.md's fleet section: One Piece's pre-scale and the
    in-flight cap with what limits it."""
    one_piece = _found(r"One Piece ×3 needs (\d+) instances", "docs/capacity.md")
    assert int(one_piece.group(1)) == _required(prod, 3.0)
    cap = _found(r"\*\*the latency SLO binds: (\d+) in flight, ([\d.]+) invocations/min\*\*",
                 "docs/capacity.md")
    assert int(cap.group(1)) == prod.instance.concurrency
    assert float(cap.group(2)) == pytest.approx(prod.instance.sustainable_invocations_per_min)
    assert prod.instance.limited_by == "latency SLO"
    assert "$8k and $36k" not in _text("docs/capacity.md")
