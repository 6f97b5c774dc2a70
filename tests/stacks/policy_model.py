"""Read a synthesized cloud assembly the way CloudFormation and IAM would, for policy tests.

* :func:`load_stacks` collects every stack of the assembly with its CloudFormation stack name,
  account and region (what ``Fn::GetStackOutput`` and ARNs need);
* :func:`resolve` follows ``Ref``, ``Fn::GetAtt``, ``Fn::GetStackOutput`` and ``Fn::ImportValue``
  across stacks to the resource they name;
* :func:`evaluate` decides one request against a resource policy's statements with IAM's rules:
  an explicit Deny wins, then any Allow, otherwise the implicit deny. It knows the principal,
  action, resource and condition forms these templates use and refuses (raises) anything else,
  so a policy it cannot read fails the test instead of passing it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.iam import decide


@dataclass(frozen=True)
class StackTemplate:
    """One synthesized stack."""

    display_name: str
    stack_name: str
    account: str
    region: str
    template: dict[str, Any]

    @property
    def resources(self) -> dict[str, Any]:
        return dict(self.template.get("Resources", {}))


def load_stacks(outdir: Path) -> list[StackTemplate]:
    """Every stack of a cloud assembly, nested stage assemblies included."""
    stacks: list[StackTemplate] = []

    def walk(directory: Path) -> None:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
        for artifact in manifest.get("artifacts", {}).values():
            props = artifact.get("properties", {})
            if artifact.get("type") == "aws:cloudformation:stack":
                _, _, account, region = artifact["environment"].split("/")
                template = json.loads((directory / props["templateFile"]).read_text("utf-8"))
                stacks.append(StackTemplate(artifact["displayName"], props["stackName"],
                                            account, region, template))
            elif artifact.get("type") == "cdk:cloud-assembly":
                walk(directory / props["directoryName"])

    walk(outdir)
    return stacks


@dataclass(frozen=True)
class ResourceRef:
    """A resource of one stack, reached through references."""

    stack: StackTemplate
    logical_id: str

    @property
    def resource(self) -> dict[str, Any]:
        return self.stack.resources[self.logical_id]

    @property
    def type(self) -> str:
        return str(self.resource["Type"])

    @property
    def arn(self) -> str:
        """A stand-in ARN, unique per resource (CloudFormation chooses the real names)."""
        service = self.type.split("::")[1].lower()
        return f"arn:aws:{service}:{self.stack.region}:{self.stack.account}:{self.logical_id}"


class UnresolvedReference(ValueError):
    """A value is not a reference this model can follow."""


def resolve(value: Any, stack: StackTemplate, stacks: Sequence[StackTemplate]) -> ResourceRef:
    """The resource ``value`` refers to, following outputs across stacks."""
    if isinstance(value, dict) and len(value) == 1:
        (function, argument), = value.items()
        if function == "Ref" and argument in stack.resources:
            return ResourceRef(stack, argument)
        if function == "Fn::GetAtt" and argument[0] in stack.resources:
            return ResourceRef(stack, argument[0])
        if function == "Fn::GetStackOutput":
            (target,) = [s for s in stacks if s.stack_name == argument["StackName"]
                         and s.region == argument.get("Region", stack.region)]
            output = target.template["Outputs"][argument["OutputName"]]
            return resolve(output["Value"], target, stacks)
        if function == "Fn::ImportValue":
            for target in stacks:
                for output in target.template.get("Outputs", {}).values():
                    if output.get("Export", {}).get("Name") == argument:
                        return resolve(output["Value"], target, stacks)
    raise UnresolvedReference(f"{stack.display_name}: cannot follow {json.dumps(value)}")


def literal(value: Any, stack: StackTemplate) -> str:
    """A string value, with the pseudo parameters and Fn::Join a policy may contain."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (function, argument), = value.items()
        pseudo = {"AWS::AccountId": stack.account, "AWS::Region": stack.region,
                  "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}
        if function == "Ref" and argument in pseudo:
            return pseudo[argument]
        if function == "Fn::Join":
            separator, parts = argument
            return separator.join(literal(part, stack) for part in parts)
    raise UnresolvedReference(f"{stack.display_name}: not a literal: {json.dumps(value)}")


# --- IAM evaluation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One call as IAM sees it."""

    principal_service: str
    action: str
    resource_arn: str
    context: Mapping[str, str]


def _glob(pattern: str, value: str, *, ignore_case: bool) -> bool:
    """IAM wildcards: ``*`` any run of characters, ``?`` one character; nothing else is special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    flags = re.IGNORECASE if ignore_case else 0
    return re.fullmatch(regex, value, flags) is not None


def _arn_like(pattern: str, value: str) -> bool:
    """ArnLike: the six colon-separated ARN components are matched one by one."""
    pattern_parts, value_parts = pattern.split(":", 5), value.split(":", 5)
    if len(pattern_parts) != 6 or len(value_parts) != 6:
        return False
    return all(_glob(p, v, ignore_case=False) for p, v in zip(pattern_parts, value_parts,
                                                              strict=True))


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


_POSITIVE_OPERATORS = {
    "StringEquals": lambda p, v: p == v,
    "StringLike": lambda p, v: _glob(p, v, ignore_case=False),
    "StringEqualsIgnoreCase": lambda p, v: p.lower() == v.lower(),
    "ArnEquals": lambda p, v: p == v,
    "ArnLike": _arn_like,
    "Bool": lambda p, v: p.lower() == v.lower(),
}
_NEGATED_OPERATORS = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike",
                      "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike"}


def _conditions_hold(conditions: Mapping[str, Any], request: Request,
                     stack: StackTemplate) -> bool:
    context = {key.lower(): value for key, value in request.context.items()}
    for operator, tests in conditions.items():
        negated = operator in _NEGATED_OPERATORS
        base = _NEGATED_OPERATORS.get(operator, operator)
        if base not in _POSITIVE_OPERATORS:
            raise UnresolvedReference(f"condition operator {operator} is not modelled")
        compare = _POSITIVE_OPERATORS[base]
        for key, expected in tests.items():
            actual = context.get(key.lower())
            patterns = [literal(item, stack) for item in _as_list(expected)]
            if actual is None:
                # A missing key fails a positive test and passes a negated one (IAM's rule).
                if not negated:
                    return False
                continue
            matched = any(compare(pattern, actual) for pattern in patterns)
            if matched == negated:
                return False
    return True


def _principal_matches(principal: Any, service: str) -> bool:
    if principal == "*":
        return True
    if isinstance(principal, dict):
        unknown = set(principal) - {"Service", "AWS"}
        if unknown:
            raise UnresolvedReference(f"principal type {sorted(unknown)} is not modelled")
        if "*" in _as_list(principal.get("AWS", [])):
            return True
        return service in _as_list(principal.get("Service", []))
    raise UnresolvedReference(f"principal {principal!r} is not modelled")


def _statement_applies(statement: Mapping[str, Any], request: Request, stack: StackTemplate,
                       resource_arn_of: Any) -> bool:
    unsupported = {"NotPrincipal", "NotAction", "NotResource"} & set(statement)
    if unsupported:
        raise UnresolvedReference(f"{sorted(unsupported)} is not modelled")
    if not _principal_matches(statement.get("Principal"), request.principal_service):
        return False
    if not any(_glob(action, request.action, ignore_case=True)
               for action in _as_list(statement["Action"])):
        return False
    resources = [resource_arn_of(item) for item in _as_list(statement.get("Resource", "*"))]
    if not any(_glob(resource, request.resource_arn, ignore_case=False)
               for resource in resources):
        return False
    return _conditions_hold(statement.get("Condition", {}), request, stack)


def evaluate(statements: Sequence[Mapping[str, Any]], request: Request, *,
             stack: StackTemplate, stacks: Sequence[StackTemplate]) -> tuple[bool, str]:
    """(allowed, why) for ``request`` under a resource policy written in ``stack``."""

    def resource_arn_of(item: Any) -> str:
        if isinstance(item, str):
            return item
        try:
            return resolve(item, stack, stacks).arn
        except UnresolvedReference:
            return literal(item, stack)

    return decide(s for s in statements if _statement_applies(s, request, stack, resource_arn_of))
