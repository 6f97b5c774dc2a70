"""Reading synthesized CloudFormation templates in tests."""

from __future__ import annotations

from typing import Any


def resources(template: dict[str, Any], resource_type: str,
              prefix: str = "") -> dict[str, dict[str, Any]]:
    """Logical id -> resource (``Type``, ``Properties``, ...) of every resource of
    ``resource_type`` whose logical id starts with ``prefix``: the shape of
    ``aws_cdk.assertions.Template.find_resources``."""
    return {logical_id: resource for logical_id, resource in template["Resources"].items()
            if resource["Type"] == resource_type and logical_id.startswith(prefix)}


def properties(template: dict[str, Any], resource_type: str,
               prefix: str = "") -> dict[str, dict[str, Any]]:
    """Logical id -> ``Properties`` of the same resources as :func:`resources`."""
    return {logical_id: resource.get("Properties", {})
            for logical_id, resource in resources(template, resource_type, prefix).items()}


def only(template: dict[str, Any], resource_type: str,
         prefix: str = "") -> tuple[str, dict[str, Any]]:
    """The one resource of ``resource_type`` whose logical id starts with ``prefix``: its logical
    id and ``Properties``; AssertionError naming how many there were otherwise."""
    found = properties(template, resource_type, prefix)
    assert len(found) == 1, f"expected one {resource_type} {prefix}*, found {len(found)}"
    ((logical_id, props),) = found.items()
    return logical_id, props
