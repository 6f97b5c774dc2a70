"""A release-calendar warning's acknowledgement id is one word: ``cdk acknowledge`` takes it
whole (a place like ``recurring[0] (jump).multiplier`` printed as is was cut at its space)."""

from __future__ import annotations

from stacks.serving_stack import acknowledgement_id


def test_the_id_has_no_spaces_or_parentheses() -> None:
    assert acknowledgement_id("recurring[0] (jump).multiplier") == (
        "release-calendar:recurring[0]-jump.multiplier")
    assert acknowledgement_id("dated[2] (one piece 1,100).min_capacity") == (
        "release-calendar:dated[2]-one-piece-1-100.min_capacity")
