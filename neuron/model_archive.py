"""model.tar.gz in SageMaker's layout, built reproducibly; and a safe extractor for local runs.

SageMaker downloads ModelDataUrl and unpacks it into /opt/ml/model, so the artifact's files sit
at the root of the archive (no leading directory). The archive is deterministic: sorted entries,
fixed mtime / owner / mode, a gzip header without a timestamp. The same compiled files therefore
give the same bytes and the same SHA-256, which keeps S3 uploads and CDK asset hashes stable.

Standard library (tarfile, gzip) and :func:`artifact_manifest.sha256_file`, Python 3.10-compatible.
"""

from __future__ import annotations

import gzip
import shutil
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from artifact_manifest import sha256_file

_FIXED_MTIME = 0
_CHUNK_BYTES = 1 << 20


def build_model_tar(artifact_dir: Path, tar_path: Path,
                    file_names: Iterable[str] | None = None) -> str:
    """Pack ``artifact_dir``'s files (or ``file_names`` from it) at the archive root.

    Only regular files directly in ``artifact_dir`` are packed; a subdirectory or a symlink is
    an error (SageMaker would unpack it, the server would never read it, and a symlink could
    point outside /opt/ml/model). Returns the archive's SHA-256.
    """
    if not artifact_dir.is_dir():
        raise FileNotFoundError(f"artifact directory {artifact_dir} does not exist")
    names = sorted(file_names) if file_names is not None else sorted(
        p.name for p in artifact_dir.iterdir())
    if not names:
        raise ValueError(f"artifact directory {artifact_dir} is empty")
    for name in names:
        path = artifact_dir / name
        if PurePosixPath(name).name != name:
            raise ValueError(f"{name!r}: only plain file names can be packed")
        if path.is_symlink() or not path.is_file():
            raise ValueError(f"{path}: not a regular file; model.tar.gz holds files only")
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    with tar_path.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=_FIXED_MTIME) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in names:
            path = artifact_dir / name
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mtime = _FIXED_MTIME
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with path.open("rb") as handle:
                archive.addfile(info, handle)
    return sha256_file(tar_path)


def list_model_tar(tar_path: Path) -> list[str]:
    """Member names of a model.tar.gz, in archive order."""
    with tarfile.open(tar_path, mode="r:gz") as archive:
        return archive.getnames()


def safe_extract(tar_path: Path, destination: Path) -> list[Path]:
    """Extract a model.tar.gz the way SageMaker lays it out, refusing anything unsafe.

    Only regular files with relative paths that stay inside ``destination`` are accepted; links,
    devices, absolute paths and ``..`` raise ValueError before anything is written.
    """
    destination.mkdir(parents=True, exist_ok=True)
    root = destination.resolve()
    with tarfile.open(tar_path, mode="r:gz") as archive:
        members = archive.getmembers()
        for member in members:
            target = (root / member.name).resolve()
            if member.name.startswith("/") or ".." in PurePosixPath(member.name).parts:
                raise ValueError(f"{tar_path}: member {member.name!r} escapes the model directory")
            if not (member.isfile() or member.isdir()):
                raise ValueError(f"{tar_path}: member {member.name!r} is not a regular file")
            if root != target and root not in target.parents:
                raise ValueError(f"{tar_path}: member {member.name!r} escapes the model directory")
        written: list[Path] = []
        for member in members:
            target = root / member.name
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            if source is None:  # pragma: no cover - isfile() members always have data
                raise ValueError(f"{tar_path}: member {member.name!r} has no data")
            with source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink, _CHUNK_BYTES)
            written.append(target)
        return written


def files_digest_map(artifact_dir: Path, file_names: Sequence[str]) -> dict[str, str]:
    """SHA-256 of each named file in ``artifact_dir`` (the manifest's ``files_sha256``)."""
    return {name: sha256_file(artifact_dir / name) for name in sorted(file_names)}


def tar_bytes_summary(tar_path: Path) -> str:
    """"model.tar.gz: N files, X.Y MiB" for progress output."""
    count = len(list_model_tar(tar_path))
    size_mib = tar_path.stat().st_size / (1024 * 1024)
    return f"{tar_path.name}: {count} files, {size_mib:.1f} MiB"


__all__ = [
    "build_model_tar",
    "files_digest_map",
    "list_model_tar",
    "safe_extract",
    "sha256_file",
    "tar_bytes_summary",
]
