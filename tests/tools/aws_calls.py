"""Record every AWS call a tool makes, and decide each as IAM would for an identity policy.

* :class:`RecordingMotoServer` — a moto server (what ``ThreadedMotoServer`` runs) behind a WSGI
  layer that records each request: the access key that signed it, the service, the API
  operation (from ``X-Amz-Target``, a query ``Action``, or S3's method, path and query) and the
  parameters IAM decides on. Any client reaches it — botocore, and the CDK CLI's JavaScript SDK
  (``AWS_ENDPOINT_URL``).
* :func:`required_permissions` — what IAM authorizes for a recorded call: the action, the
  resource ARN and the condition keys, from AWS's documentation (cited per entry), including
  what S3 asks KMS on the caller's behalf for SSE-KMS objects. An operation it does not know
  fails the test that meets it: nothing a tool calls goes unchecked.
* :func:`evaluate` — IAM's rule for one identity policy: an explicit Deny wins, then an Allow
  whose action, resource and conditions match, otherwise the implicit deny ("IAM policy
  evaluation logic": "By default, all requests are implicitly denied"). Unknown condition
  operators raise instead of passing.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from tests.support.iam import decide

NO_PERMISSION = frozenset({("sts", "GetCallerIdentity")})
"""Calls IAM never denies: "No permissions are required to perform this operation" (AWS STS API
Reference, GetCallerIdentity)."""


@dataclass(frozen=True)
class Call:
    """One recorded request."""

    access_key: str
    service: str
    region: str
    operation: str
    params: Mapping[str, Any]
    status: int = 0
    response_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Permission:
    """What IAM authorizes for (part of) one call."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)
    why: str = ""


# --- recording ----------------------------------------------------------------------------------

_CREDENTIAL = re.compile(r"Credential=([^/]+)/\d+/([^/]+)/([^/]+)/")


def _s3_operation(method: str, path: str, query: Mapping[str, list[str]],
                  headers: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    parts = unquote(path).lstrip("/").split("/", 1)
    bucket = parts[0]
    key = parts[1] if len(parts) > 1 and parts[1] else None
    params: dict[str, Any] = {"Bucket": bucket}
    if key is not None:
        params["Key"] = key
    if "x-amz-server-side-encryption-aws-kms-key-id" in headers:
        params["SSEKMSKeyId"] = headers["x-amz-server-side-encryption-aws-kms-key-id"]
    if "x-amz-copy-source" in headers:
        params["CopySource"] = unquote(headers["x-amz-copy-source"]).lstrip("/")
    if key is None:
        for flag, operation in (("list-type", "ListObjectsV2"), ("location", "GetBucketLocation"),
                                ("encryption", "GetBucketEncryption"),
                                ("versioning", "GetBucketVersioning")):
            if flag in query:
                params["Prefix"] = query.get("prefix", [""])[0]
                return operation, params
        return {"HEAD": "HeadBucket", "PUT": "CreateBucket"}.get(method, "ListObjects"), params
    if method == "HEAD":
        return "HeadObject", params
    if method == "GET":
        return "GetObject", params
    if method == "DELETE":
        return ("AbortMultipartUpload" if "uploadId" in query else "DeleteObject"), params
    if method == "POST":
        return ("CreateMultipartUpload" if "uploads" in query else "CompleteMultipartUpload"), \
            params
    if "partNumber" in query:
        return ("UploadPartCopy" if "CopySource" in params else "UploadPart"), params
    return ("CopyObject" if "CopySource" in params else "PutObject"), params


def identify(method: str, path: str, query_string: str, headers: Mapping[str, str],
             body: bytes) -> tuple[str, str, str, dict[str, Any]] | None:
    """(access key, service, operation, params) of a signed request; None when unsigned."""
    match = _CREDENTIAL.search(headers.get("authorization", ""))
    if not match:
        return None
    access_key, _region, service = match.groups()
    query = parse_qs(query_string, keep_blank_values=True)
    target = headers.get("x-amz-target")
    if target:
        params = json.loads(body or b"{}")
        return access_key, service, target.rsplit(".", 1)[-1], params
    if service == "s3":
        operation, params = _s3_operation(method, path, query, headers)
        return access_key, service, operation, params
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"),
                                          keep_blank_values=True).items()}
    form.update({k: v[0] for k, v in query.items()})
    return access_key, service, str(form.pop("Action", "?")), form


class _Recorder:
    """WSGI middleware around moto's application."""

    def __init__(self, app: Any, calls: list[Call]) -> None:
        self.app, self.calls, self.lock = app, calls, threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        found = identify(environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/"),
                         environ.get("QUERY_STRING", ""), headers, body)
        captured: dict[str, Any] = {}

        def recording_start(status: str, response_headers: list[tuple[str, str]],
                            *args: Any) -> Any:
            captured["status"] = int(status.split()[0])
            captured["headers"] = {k.lower(): v for k, v in response_headers}
            return start_response(status, response_headers, *args)

        result = self.app(environ, recording_start)
        if found is not None:
            access_key, service, operation, params = found
            region = _CREDENTIAL.search(headers["authorization"]).group(2)  # type: ignore[union-attr]
            with self.lock:
                self.calls.append(Call(access_key, service, region, operation, params,
                                       captured.get("status", 0), captured.get("headers", {})))
        return result


class RecordingMotoServer:
    """A threaded moto server whose every signed request is recorded in ``calls``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.calls: list[Call] = []
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        """``localhost``: moto resolves a CloudFormation TemplateURL on localhost path-style."""
        return f"http://localhost:{self.port}"

    def start(self) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        app = _Recorder(DomainDispatcherApplication(create_backend_app), self.calls)
        self._server = make_server("127.0.0.1", self.port, app, True,
                                   request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
        if self._thread is not None:
            self._thread.join()

    def by(self, access_key: str) -> list[Call]:
        """The calls signed with ``access_key``."""
        return [call for call in self.calls if call.access_key == access_key]


# --- what IAM authorizes for a call -------------------------------------------------------------

def _s3_object(call: Call) -> str:
    return f"arn:aws:s3:::{call.params['Bucket']}/{call.params['Key']}"


def _kms_via_s3(call: Call, key: str, action: str, why: str) -> Permission:
    return Permission(action, key, {"kms:ViaService": f"s3.{call.region}.amazonaws.com"}, why)


def _s3_put(call: Call) -> list[Permission]:
    """PutObject, CopyObject and the multipart upload's parts: s3:PutObject ("Amazon S3 API
    Reference", PutObject/UploadPart/CompleteMultipartUpload: "you must have the s3:PutObject
    permission"); with SSE-KMS, what S3 asks KMS for the caller: "kms:GenerateDataKey" to put,
    and for a multipart upload also "kms:Decrypt" ("Using server-side encryption with AWS KMS
    keys (SSE-KMS)", Amazon S3 User Guide: "To upload an object with SSE-KMS, you need
    kms:GenerateDataKey ... to perform a multipart upload ... kms:Decrypt and
    kms:GenerateDataKey")."""
    found = [Permission("s3:PutObject", _s3_object(call), why="PutObject family")]
    key = call.params.get("SSEKMSKeyId")
    if key and call.operation in ("PutObject", "CreateMultipartUpload", "CopyObject"):
        found.append(_kms_via_s3(call, key, "kms:GenerateDataKey", "SSE-KMS upload"))
        if call.operation == "CreateMultipartUpload":
            found.append(_kms_via_s3(call, key, "kms:Decrypt", "SSE-KMS multipart upload"))
    if "CopySource" in call.params:
        found.append(Permission("s3:GetObject", f"arn:aws:s3:::{call.params['CopySource']}",
                                why="CopyObject reads its source"))
    return found


def _s3_get(call: Call) -> list[Permission]:
    """GetObject and HeadObject: s3:GetObject ("HeadObject ... you must have the s3:GetObject
    permission"); an SSE-KMS object's GET also needs kms:Decrypt (S3 asks KMS for the caller;
    HEAD reads only metadata)."""
    found = [Permission("s3:GetObject", _s3_object(call), why=call.operation)]
    key = call.response_headers.get("x-amz-server-side-encryption-aws-kms-key-id")
    if key and call.operation == "GetObject" and call.status == 200:
        found.append(_kms_via_s3(call, key, "kms:Decrypt", "GET of an SSE-KMS object"))
    return found


def _arn(call: Call, account: str, service: str, resource: str) -> str:
    return f"arn:aws:{service}:{call.region}:{account}:{resource}"


def _scalable_target_write(call: Call, account: str, operation: str
                           ) -> Callable[[], list[Permission]]:
    """Application Auto Scaling's writes on a scalable target (its ARN holds an id only AWS
    knows, hence ``scalable-target/*``; the tag condition narrows it)."""
    return lambda: [Permission(f"application-autoscaling:{operation}",
                               _arn(call, account, "application-autoscaling",
                                    "scalable-target/*"))]


def required_permissions(call: Call, account: str,
                         resource_context: Mapping[str, Any] | None = None) -> list[Permission]:
    """What IAM must allow for ``call`` (empty for calls that need no permission).

    ``resource_context`` holds condition keys the resources themselves supply (a key's aliases,
    ``kms:ResourceAliases``; a scalable target's tags, ``aws:ResourceTag/...``). KeyError names an
    operation this table does not know: add it, with its source.
    """
    if (call.service, call.operation) in NO_PERMISSION:
        return []
    p = call.params
    table: dict[tuple[str, str], Callable[[], list[Permission]]] = {
        ("sts", "AssumeRole"): lambda: [Permission("sts:AssumeRole", p["RoleArn"])],
        ("cloudformation", "DescribeStacks"): lambda: [Permission(
            "cloudformation:DescribeStacks",
            _arn(call, account, "cloudformation", f"stack/{p['StackName']}/*"))],
        ("ssm", "GetParameter"): lambda: [Permission(
            "ssm:GetParameter", _arn(call, account, "ssm",
                                     "parameter" + (p["Name"] if p["Name"].startswith("/")
                                                    else "/" + p["Name"])))],
        ("servicequotas", "ListServiceQuotas"): lambda: [
            Permission("servicequotas:ListServiceQuotas", "*")],
        ("servicequotas", "ListAWSDefaultServiceQuotas"): lambda: [
            Permission("servicequotas:ListAWSDefaultServiceQuotas", "*")],
        ("s3", "HeadObject"): lambda: _s3_get(call),
        ("s3", "GetObject"): lambda: _s3_get(call),
        ("s3", "PutObject"): lambda: _s3_put(call),
        ("s3", "CopyObject"): lambda: _s3_put(call),
        ("s3", "CreateMultipartUpload"): lambda: _s3_put(call),
        ("s3", "UploadPart"): lambda: _s3_put(call),
        ("s3", "UploadPartCopy"): lambda: _s3_put(call),
        ("s3", "CompleteMultipartUpload"): lambda: _s3_put(call),
        ("s3", "AbortMultipartUpload"): lambda: [Permission("s3:AbortMultipartUpload",
                                                            _s3_object(call))],
        ("s3", "ListObjectsV2"): lambda: [Permission(
            "s3:ListBucket", f"arn:aws:s3:::{p['Bucket']}", {"s3:prefix": p.get("Prefix", "")})],
        ("ecr", "DescribeImages"): lambda: [Permission(
            "ecr:DescribeImages", _arn(call, account, "ecr",
                                       f"repository/{p['repositoryName']}"))],
        ("sagemaker", "DescribeEndpoint"): lambda: [Permission(
            "sagemaker:DescribeEndpoint",
            _arn(call, account, "sagemaker", f"endpoint/{p['EndpointName'].lower()}"))],
        ("sagemaker", "DescribeEndpointConfig"): lambda: [Permission(
            "sagemaker:DescribeEndpointConfig",
            _arn(call, account, "sagemaker",
                 f"endpoint-config/{p['EndpointConfigName'].lower()}"))],
        ("application-autoscaling", "DescribeScalableTargets"): lambda: [Permission(
            "application-autoscaling:DescribeScalableTargets", "*")],
        ("application-autoscaling", "DescribeScalingPolicies"): lambda: [Permission(
            "application-autoscaling:DescribeScalingPolicies", "*")],
        ("application-autoscaling", "DescribeScheduledActions"): lambda: [Permission(
            "application-autoscaling:DescribeScheduledActions", "*")],
    }
    for op in ("DeregisterScalableTarget", "DeleteScalingPolicy", "DeleteScheduledAction"):
        table[("application-autoscaling", op)] = _scalable_target_write(call, account, op)
    found = table[(call.service, call.operation)]()
    # What the resources carry (the project key's alias, the scalable targets' tags): the test
    # that builds them says so and checks it; the call's own keys win.
    return [Permission(x.action, x.resource, {**(resource_context or {}), **x.context}, x.why)
            for x in found]


# --- IAM's evaluation of one identity policy ---------------------------------------------------

def _glob(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.IGNORECASE if ignore_case else 0) is not None


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


_OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda pattern, value: pattern == value,
    "StringLike": lambda pattern, value: _glob(pattern, value),
    "ArnLike": lambda pattern, value: _glob(pattern, value),
    "ArnEquals": lambda pattern, value: pattern == value,
    "Bool": lambda pattern, value: pattern.lower() == value.lower(),
}


def _condition_holds(operator: str, tests: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
    quantifier, _, base = operator.rpartition(":")
    if base not in _OPERATORS or quantifier not in ("", "ForAnyValue"):
        raise ValueError(f"condition operator {operator} is not modelled")
    compare = _OPERATORS[base]
    for key, expected in tests.items():
        actual = context.get(key)
        if actual is None:
            return False  # a missing key fails a positive condition
        values = _listed(actual) if quantifier == "ForAnyValue" else [actual]
        if not any(compare(str(pattern), str(value)) for pattern in _listed(expected)
                   for value in values):
            return False
    return True


def _applies(statement: Mapping[str, Any], permission: Permission) -> bool:
    if {"NotAction", "NotResource", "Principal"} & set(statement):
        raise ValueError(f"statement {statement.get('Sid')}: not an identity statement this "
                         "model reads")
    if not any(_glob(a, permission.action, ignore_case=True) for a in _listed(statement["Action"])):
        return False
    if not any(_glob(r, permission.resource) for r in _listed(statement.get("Resource", "*"))):
        return False
    return all(_condition_holds(op, tests, permission.context)
               for op, tests in statement.get("Condition", {}).items())


def evaluate(policy: Mapping[str, Any], permission: Permission) -> tuple[bool, str]:
    """(allowed, why) for one permission under one identity policy."""
    return decide(s for s in policy["Statement"] if _applies(s, permission))


def unauthorized(calls: Iterable[Call], policy: Mapping[str, Any], account: str,
                 resource_context: Mapping[str, Any] | None = None) -> list[str]:
    """One line per permission of ``calls`` that ``policy`` does not allow."""
    refused = []
    for call in calls:
        for permission in required_permissions(call, account, resource_context):
            allowed, why = evaluate(policy, permission)
            if not allowed:
                refused.append(f"{call.service}:{call.operation} needs {permission.action} on "
                               f"{permission.resource} {dict(permission.context)}: {why}")
    return refused
