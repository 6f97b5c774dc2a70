"""IAM's decision for one request once the statements that apply to it are known, shared by the
policy models of the stack tests (resource policies) and the tool tests (identity policies)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def decide(applicable: Iterable[Mapping[str, Any]]) -> tuple[bool, str]:
    """(allowed, why): an explicit Deny wins, then any Allow, otherwise the implicit deny;
    statements named by Sid ("(no Sid)" where they have none)."""
    statements = list(applicable)
    denies = [s.get("Sid", "(no Sid)") for s in statements if s["Effect"] == "Deny"]
    if denies:
        return False, f"explicitly denied by {denies}"
    allows = [s.get("Sid", "(no Sid)") for s in statements if s["Effect"] == "Allow"]
    if allows:
        return True, f"allowed by {allows}"
    return False, "no statement allows it (implicit deny)"
