"""Upload one artifact to S3: SSE-KMS with the project key, parallel parts, resumable.

* Every object is encrypted with the project key (SSE-KMS), whatever the bucket default is.
* Files above the part size go up as multipart uploads with parallel parts (boto3's
  ``TransferConfig``).
* Each object carries its SHA-256 in its metadata (``x-amz-meta-sha256``). S3's own
  ``ChecksumSHA256`` of a multipart object is a checksum of the parts' checksums, not of the
  file, so it cannot be compared with a local file's digest; the metadata can. A file whose key
  already holds the same size, digest and key is skipped, so a re-run after an interruption
  uploads only what is missing.
* ``artifact-manifest.json`` goes up last: its presence means every file it lists is there.
* Progress: one line per file, and every 10 % of a large one.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from tools.publish.checks import ArtifactUpload, LocalFile, stale_keys

SHA256_METADATA = "sha256"
"""User metadata key of an object's SHA-256 (S3 returns it as ``x-amz-meta-sha256``)."""
MIB = 1024 * 1024


def human_bytes(size: int) -> str:
    """``1.2 GiB``, ``340.0 MiB``, ``1.4 KiB``, ``12 B``."""
    if size >= 1 << 30:
        return f"{size / (1 << 30):.1f} GiB"
    if size >= MIB:
        return f"{size / MIB:.1f} MiB"
    if size >= 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size} B"


def transfer_config(*, part_size_mib: int, threads: int) -> Any:
    """Multipart above one part, ``threads`` parts in flight at once."""
    from boto3.s3.transfer import TransferConfig

    part = part_size_mib * MIB
    return TransferConfig(multipart_threshold=part, multipart_chunksize=part,
                          max_concurrency=threads, use_threads=threads > 1)


class ByteProgress:
    """boto3 transfer callback: prints at every 10 % (called from several threads)."""

    def __init__(self, label: str, total: int, out: TextIO) -> None:
        self.label, self.total, self.out = label, total, out
        self.done = 0
        self.next_percent = 10
        self.lock = threading.Lock()

    def __call__(self, amount: int) -> None:
        with self.lock:
            self.done += amount
            percent = 100 * self.done // self.total if self.total else 100
            if percent >= self.next_percent and percent < 100:
                print(f"      {self.label}: {percent} % of {human_bytes(self.total)}",
                      file=self.out, flush=True)
                self.next_percent = percent - percent % 10 + 10


def _same_key(a: str | None, b: str) -> bool:
    """KMS key ids compare equal as ARNs or as bare ids."""
    return a is not None and (a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1])


@dataclass
class PublishResult:
    """What one artifact's publication did."""

    uploaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    manifest_key: str = ""


class ArtifactPublisher:
    """Uploads artifacts to one bucket with one KMS key."""

    def __init__(self, s3: Any, bucket: str, *, kms_key_arn: str, expected_owner: str,
                 config: Any, out: TextIO) -> None:
        self.s3, self.bucket, self.kms_key_arn = s3, bucket, kms_key_arn
        self.expected_owner, self.config, self.out = expected_owner, config, out

    def _encryption(self, digest: str) -> dict[str, Any]:
        return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.kms_key_arn,
                "Metadata": {SHA256_METADATA: digest},
                "ExpectedBucketOwner": self.expected_owner}

    def already_there(self, key: str, local: LocalFile) -> bool:
        """True when ``key`` holds exactly this file, encrypted with the project key."""
        from botocore.exceptions import ClientError

        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=key,
                                       ExpectedBucketOwner=self.expected_owner)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return (head.get("ContentLength") == local.size
                and head.get("Metadata", {}).get(SHA256_METADATA) == local.sha256
                and head.get("ServerSideEncryption") == "aws:kms"
                and _same_key(head.get("SSEKMSKeyId"), self.kms_key_arn))

    def publish(self, upload: ArtifactUpload) -> PublishResult:
        """Upload what is missing or different, then the manifest; report stray objects."""
        result = PublishResult(manifest_key=upload.artifact.manifest_key)
        files = sorted(upload.files, key=lambda f: f.relative)
        count = len(files)
        print(f"{upload.artifact.endpoint}: {count} file{'s' if count != 1 else ''}, "
              f"{human_bytes(upload.total_bytes)} "
              f"-> s3://{self.bucket}/{upload.artifact.read_prefix}/", file=self.out, flush=True)
        for index, local in enumerate(files, start=1):
            key = upload.artifact.key(local.relative)
            if self.already_there(key, local):
                print(f"  [{index}/{count}] unchanged {local.relative} (same SHA-256)",
                      file=self.out, flush=True)
                result.unchanged.append(key)
                continue
            print(f"  [{index}/{count}] uploading {local.relative} ({human_bytes(local.size)})",
                  file=self.out, flush=True)
            self.s3.upload_file(str(local.path), self.bucket, key,
                                ExtraArgs=self._encryption(local.sha256), Config=self.config,
                                Callback=ByteProgress(local.relative, local.size, self.out))
            result.uploaded.append(key)
        body = upload.manifest.to_json().encode("utf-8")
        self.s3.put_object(Bucket=self.bucket, Key=upload.artifact.manifest_key, Body=body,
                           ContentType="application/json",
                           **self._encryption(_sha256_bytes(body)))
        print(f"  manifest s3://{self.bucket}/{upload.artifact.manifest_key}", file=self.out,
              flush=True)
        result.stale = stale_keys(upload, self.list_keys(f"{upload.artifact.read_prefix}/"))
        return result

    def list_keys(self, prefix: str) -> Sequence[str]:
        """Every key under ``prefix``."""
        keys: list[str] = []
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                       ExpectedBucketOwner=self.expected_owner):
            keys += [item["Key"] for item in page.get("Contents", [])]
        return keys


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


__all__ = ["SHA256_METADATA", "ArtifactPublisher", "PublishResult", "human_bytes",
           "transfer_config"]
