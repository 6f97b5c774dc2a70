"""artifact-manifest.json: the size and SHA-256 of every file of a model artifact, and its check.

An endpoint's model data reaches the container through S3 and SageMaker's download; a partial
upload, an interrupted re-upload or a file left over from another model would otherwise surface
as a confusing engine error (or none) twenty minutes into a deployment. So every artifact carries
a manifest, and everything downstream checks against it:

* ``make publish`` (tools/publish) writes one next to the files it uploads (the LLM's S3 prefix,
  the intent archive's folder); ``make preflight`` checks the S3 objects against it;
* ``neuron/compile.py`` writes one inside ``model.tar.gz`` (SageMaker unpacks the archive into
  the model directory, so the container sees that one);
* both serving containers call :func:`check_model_dir` before their engine starts and exit with
  one line naming the first file that does not match. A directory without a manifest (a local
  run, ``make local``) is not checked.

The manifest lists files by their path relative to the artifact root, in POSIX form. Files the
manifest does not list are ignored here (preflight reports stray objects in S3).

An LLM model's manifest also names its LoRA adapters (``adapters``: served name -> folder and
:func:`adapter_checksum`): the quantization job's candidate names the adapters its quality gate
evaluated, ``make promote`` carries them to the served prefix and ``make publish`` names the ones
it publishes with a model. The LLM container refuses to serve an adapter its model's manifest does
not name, or whose files differ from that checksum (:func:`check_named_adapters`).

An LLM model may also carry a GPU start cache (``start-cache/start-cache.json`` and
``start-cache/start-cache.tar.gz``: compiled kernels for one GPU type and engine configuration,
docs/develop.md#the-start-cache). It is optional, so its files are named in their own entry,
``start_cache`` (path -> size and SHA-256), not in ``files``: a start cache that differs from that
entry, or one the manifest does not name, is refused by the container and the start goes on
without it (:func:`start_cache_problem`); it never fails :func:`check_model_dir`.

Pure module (standard library only), Python 3.10-compatible: the Inf1 serving image runs 3.10.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_FILE = "artifact-manifest.json"
START_CACHE_DIR = "start-cache"
"""The model directory's folder of the optional GPU start cache (its own manifest entry)."""
FORMAT_VERSION = 1
_CHUNK_BYTES = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ValueError):
    """The manifest itself is unreadable or malformed. The message names the field."""


class ArtifactMismatch(ValueError):
    """A file is missing or differs from the manifest. The message is one line naming the file."""


@dataclass(frozen=True)
class FileDigest:
    """What one file must be: its size in bytes and its lowercase hex SHA-256."""

    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class NamedAdapter:
    """An adapter a model's manifest names: its folder under ``adapters/`` and its checksum."""

    directory: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"directory": self.directory, "sha256": self.sha256}


@dataclass(frozen=True)
class ArtifactFiles:
    """The contents of an artifact-manifest.json: relative path -> size and SHA-256, and the
    LoRA adapters named for the model (served name -> folder and checksum; none for others)."""

    files: Mapping[str, FileDigest]
    format_version: int = FORMAT_VERSION
    adapters: Mapping[str, NamedAdapter] = field(default_factory=dict)
    start_cache: Mapping[str, FileDigest] = field(default_factory=dict)
    """The optional GPU start cache's files (``start-cache/...``): checked by the container,
    refused (never fatal) when they differ."""

    @property
    def all_files(self) -> Mapping[str, FileDigest]:
        """Every file the artifact holds: ``files`` and the start cache's."""
        return {**self.files, **self.start_cache}

    @property
    def total_bytes(self) -> int:
        """Bytes of every listed file together."""
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> str:
        """Stable, pretty JSON (sorted paths), newline-terminated."""
        data: dict[str, Any] = {
            "format_version": self.format_version,
            "files": {path: self.files[path].to_dict() for path in sorted(self.files)},
        }
        if self.start_cache:
            data["start_cache"] = {path: self.start_cache[path].to_dict()
                                   for path in sorted(self.start_cache)}
        if self.adapters:
            data["adapters"] = {name: self.adapters[name].to_dict()
                                for name in sorted(self.adapters)}
        return json.dumps(data, indent=2) + "\n"


def sha256_file(path: Path) -> str:
    """Lowercase hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checked_relative_path(value: Any, *, where: str) -> str:
    """``value`` if it is a relative POSIX path that stays inside the artifact root."""
    if not isinstance(value, str) or not value or value.startswith("/") or "\\" in value:
        raise ManifestError(f"{where}: {value!r} is not a relative path inside the artifact")
    parts = PurePosixPath(value).parts
    if any(part in ("", ".", "..") for part in parts) or str(PurePosixPath(value)) != value:
        raise ManifestError(f"{where}: {value!r} is not a plain relative path inside the artifact")
    return value


def artifact_files_from_json(text: str, *, source: str = MANIFEST_FILE) -> ArtifactFiles:
    """Parse and validate manifest text; ManifestError names ``source`` and the bad field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"{source}: not valid JSON ({error.msg})") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: expected a JSON object")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(f"{source}: format_version {version!r} is not accepted; "
                            f"this reader knows {FORMAT_VERSION}")
    raw = data.get("files")
    if not isinstance(raw, dict):
        raise ManifestError(f"{source}: files: expected an object of path -> size and sha256")
    start_cache = data.get("start_cache", {})
    if not isinstance(start_cache, dict):
        raise ManifestError(f"{source}: start_cache: expected an object of path -> size and "
                            "sha256")
    for path in start_cache:
        if not str(path).startswith(f"{START_CACHE_DIR}/"):
            raise ManifestError(f"{source}: start_cache: {path!r} is not under "
                                f"{START_CACHE_DIR}/")
    return ArtifactFiles(files=_file_digests(raw, f"{source}: files"),
                         adapters=_named_adapters(data.get("adapters"), source),
                         start_cache=_file_digests(start_cache, f"{source}: start_cache"))


def _file_digests(raw: Mapping[str, Any], where_all: str) -> dict[str, FileDigest]:
    """Path -> size and SHA-256 entries, each checked; ManifestError names the bad field."""
    files: dict[str, FileDigest] = {}
    for path, entry in raw.items():
        where = f"{where_all}[{path!r}]"
        checked_relative_path(path, where=where_all)
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: expected an object with size and sha256")
        size, digest = entry.get("size"), entry.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ManifestError(f"{where}.size: {size!r} is not a byte count")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise ManifestError(f"{where}.sha256: {digest!r} is not a lowercase hex SHA-256")
        files[path] = FileDigest(size=size, sha256=digest)
    return files


def _named_adapters(raw: Any, source: str) -> dict[str, NamedAdapter]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ManifestError(f"{source}: adapters: expected an object of adapter name -> "
                            "directory and sha256")
    adapters: dict[str, NamedAdapter] = {}
    for name, entry in raw.items():
        where = f"{source}: adapters[{name!r}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: expected an object with directory and sha256")
        directory, digest = entry.get("directory"), entry.get("sha256")
        if not isinstance(directory, str) or not directory or "/" in directory \
                or directory in (".", ".."):
            raise ManifestError(f"{where}.directory: {directory!r} is not accepted; a folder "
                                "name under adapters/")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise ManifestError(f"{where}.sha256: {digest!r} is not a lowercase hex SHA-256")
        adapters[name] = NamedAdapter(directory=directory, sha256=digest)
    return adapters


def adapter_checksum(file_digests: Mapping[str, str]) -> str:
    """One adapter's checksum: the SHA-256 of one line per file, ``<path in the folder>``, a tab,
    its SHA-256, in path order. The same from a directory (:func:`adapter_dir_checksum`) and from
    a model manifest's ``adapters/<folder>/...`` entries (:func:`adapter_checksum_in`)."""
    if not file_digests:
        raise ValueError("adapter_checksum: an adapter without files")
    lines = "".join(f"{path}\t{file_digests[path]}\n" for path in sorted(file_digests))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def adapter_dir_checksum(directory: Path) -> str:
    """:func:`adapter_checksum` of every file in an adapter folder."""
    names = list_artifact_files(directory)
    if not names:
        raise FileNotFoundError(f"{directory}: no files: not a LoRA adapter folder")
    return adapter_checksum({name: sha256_file(directory / name) for name in names})


def adapter_checksum_in(manifest: ArtifactFiles, folder: str, root: str = "adapters") -> str | None:
    """:func:`adapter_checksum` of ``<root>/<folder>/`` as a model manifest lists it (None: the
    manifest lists no file there)."""
    prefix = f"{root}/{folder}/"
    digests = {path[len(prefix):]: digest.sha256 for path, digest in manifest.files.items()
               if path.startswith(prefix)}
    return adapter_checksum(digests) if digests else None


def list_artifact_files(root: Path) -> list[str]:
    """Every regular file under ``root`` as a sorted relative POSIX path, the manifest excluded.

    A symlink is refused: SageMaker copies objects, not links, so a link in a directory about to
    be published would upload what it points at under another name.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    names: list[str] = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise ValueError(f"{path}: a symlink; publish the file itself")
        if path.is_file() and relative != MANIFEST_FILE:
            names.append(relative)
    return names


def describe_files(root: Path, names: Iterable[str]) -> ArtifactFiles:
    """Size and SHA-256 of each named file under ``root``."""
    files: dict[str, FileDigest] = {}
    for name in names:
        path = root / checked_relative_path(name, where="describe_files")
        files[name] = FileDigest(size=path.stat().st_size, sha256=sha256_file(path))
    return ArtifactFiles(files=files)


def find_mismatch(root: Path, manifest: ArtifactFiles) -> str | None:
    """The first file under ``root`` that is missing or differs from ``manifest``, as one line.

    Sizes are compared for every file before any is hashed, so a truncated download is reported
    at once instead of after hashing gigabytes of weights.
    """
    for name in sorted(manifest.files):
        path = root / name
        expected = manifest.files[name]
        if not path.is_file():
            return f"{name}: listed in {MANIFEST_FILE} but missing from {root}"
        size = path.stat().st_size
        if size != expected.size:
            return (f"{name}: {size} bytes, but {MANIFEST_FILE} says {expected.size} "
                    "(an incomplete download or a different upload)")
    for name in sorted(manifest.files):
        actual = sha256_file(root / name)
        expected_digest = manifest.files[name].sha256
        if actual != expected_digest:
            return (f"{name}: SHA-256 {actual[:12]}… differs from {MANIFEST_FILE}'s "
                    f"{expected_digest[:12]}… (a corrupt or mixed-up artifact)")
    return None


@dataclass(frozen=True)
class DirectoryCheck:
    """What :func:`check_model_dir` did: how many files and bytes it verified."""

    files: int
    total_bytes: int

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.files == 0:
            return f"no {MANIFEST_FILE} in the model directory: its files were not verified"
        return (f"{MANIFEST_FILE}: {self.files} files, {self.total_bytes / 2**30:.2f} GiB, "
                "sizes and SHA-256 match")


def check_model_dir(model_dir: Path | str) -> DirectoryCheck:
    """Verify ``model_dir`` against its artifact-manifest.json, if it has one.

    Raises :class:`ArtifactMismatch` (one line, naming the file) when a listed file is missing or
    differs, or when the manifest itself is malformed. Without a manifest nothing is checked and
    the result says so (``files == 0``): local runs have none.
    """
    root = Path(model_dir)
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        return DirectoryCheck(files=0, total_bytes=0)
    try:
        manifest = artifact_files_from_json(manifest_path.read_text(encoding="utf-8"),
                                            source=str(manifest_path))
    except ManifestError as error:
        raise ArtifactMismatch(f"artifact check: {error}") from None
    problem = find_mismatch(root, manifest)
    if problem is not None:
        raise ArtifactMismatch(f"artifact check: {problem}")
    return DirectoryCheck(files=len(manifest.files), total_bytes=manifest.total_bytes)


def start_cache_problem(model_dir: Path | str) -> str | None:
    """The model directory's start cache (``start-cache/``) against its manifest's
    ``start_cache`` entry: None when it matches or when the directory has no manifest (a local
    run), else one line naming the file. A start cache the manifest does not name, or one whose
    files differ, is a problem (the container refuses it and starts without it)."""
    root = Path(model_dir)
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        return None
    try:
        manifest = artifact_files_from_json(manifest_path.read_text(encoding="utf-8"),
                                            source=str(manifest_path))
    except ManifestError as error:
        return str(error)
    if not manifest.start_cache:
        return (f"{START_CACHE_DIR}/: {MANIFEST_FILE} names no start cache for this model "
                "(not published with it)")
    return find_mismatch(root, ArtifactFiles(files=manifest.start_cache))


def check_named_adapters(model_dir: Path | str, adapters_dir: Path | str,
                         served: Sequence[tuple[str, str]]) -> int:
    """Every served adapter (``(name, folder)``) is one the model's manifest names, with the same
    folder and files; the count checked (0 without a manifest: local runs are not checked).

    A model is served only with the adapters named for it: for a quantized model, the ones its
    quality gate evaluated on it. :class:`ArtifactMismatch` (one line) names the first that is not.
    """
    manifest_path = Path(model_dir) / MANIFEST_FILE
    if not served or not manifest_path.is_file():
        return 0
    try:
        manifest = artifact_files_from_json(manifest_path.read_text(encoding="utf-8"),
                                            source=str(manifest_path))
    except ManifestError as error:
        raise ArtifactMismatch(f"artifact check: {error}") from None
    named = ", ".join(sorted(manifest.adapters)) or "none"
    for name, folder in served:
        entry = manifest.adapters.get(name)
        if entry is None:
            raise ArtifactMismatch(
                f"adapter check: adapter {name!r} (GATEWAY_ADAPTERS) is not named in "
                f"{MANIFEST_FILE} for this model (it names: {named}); a model is served only "
                "with the adapters its quality gate evaluated on it: gate it (make quantize), "
                "then make promote")
        if entry.directory != folder:
            raise ArtifactMismatch(
                f"adapter check: adapter {name!r} is served from folder {folder!r}, but "
                f"{MANIFEST_FILE} names folder {entry.directory!r} for it")
        try:
            actual = adapter_dir_checksum(Path(adapters_dir) / folder)
        except (FileNotFoundError, ValueError) as error:
            raise ArtifactMismatch(f"adapter check: adapter {name!r}: {error}") from None
        if actual != entry.sha256:
            raise ArtifactMismatch(
                f"adapter check: adapter {name!r} in {Path(adapters_dir) / folder}: checksum "
                f"{actual[:12]}… differs from the {entry.sha256[:12]}… {MANIFEST_FILE} names "
                "(not the adapter this model was gated with)")
    return len(served)


__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "START_CACHE_DIR",
    "ArtifactFiles",
    "ArtifactMismatch",
    "DirectoryCheck",
    "FileDigest",
    "ManifestError",
    "NamedAdapter",
    "adapter_checksum",
    "adapter_checksum_in",
    "adapter_dir_checksum",
    "artifact_files_from_json",
    "check_model_dir",
    "check_named_adapters",
    "checked_relative_path",
    "describe_files",
    "find_mismatch",
    "list_artifact_files",
    "sha256_file",
    "start_cache_problem",
]
