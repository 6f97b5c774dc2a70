"""model.tar.gz: SageMaker layout, byte-for-byte reproducible, and a safe extractor."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from neuron.model_archive import build_model_tar, list_model_tar, safe_extract, sha256_file


@pytest.fixture
def artifact_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "manifest.json").write_text('{"target": "cpu"}\n')
    (directory / "model-b1.pt").write_bytes(os.urandom(3000))
    (directory / "tokenizer.json").write_text("{}")
    return directory


def test_files_sit_at_the_root_in_sorted_order(artifact_dir: Path, tmp_path: Path) -> None:
    digest = build_model_tar(artifact_dir, tmp_path / "model.tar.gz")
    assert list_model_tar(tmp_path / "model.tar.gz") == [
        "manifest.json", "model-b1.pt", "tokenizer.json"]
    assert digest == sha256_file(tmp_path / "model.tar.gz")
    with tarfile.open(tmp_path / "model.tar.gz") as archive:
        for member in archive.getmembers():
            assert (member.mtime, member.uid, member.gid, member.mode) == (0, 0, 0, 0o644)


def test_same_files_give_the_same_bytes(artifact_dir: Path, tmp_path: Path) -> None:
    first = build_model_tar(artifact_dir, tmp_path / "a.tar.gz")
    os.utime(artifact_dir / "model-b1.pt", (1, 1))  # a newer mtime must not change the archive
    second = build_model_tar(artifact_dir, tmp_path / "b.tar.gz")
    assert first == second
    (artifact_dir / "tokenizer.json").write_text('{"changed": true}')
    assert build_model_tar(artifact_dir, tmp_path / "c.tar.gz") != first


def test_only_plain_files_are_packed(artifact_dir: Path, tmp_path: Path) -> None:
    (artifact_dir / "nested").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        build_model_tar(artifact_dir, tmp_path / "x.tar.gz")
    (artifact_dir / "nested").rmdir()
    (artifact_dir / "link.json").symlink_to(artifact_dir / "manifest.json")
    with pytest.raises(ValueError, match="not a regular file"):
        build_model_tar(artifact_dir, tmp_path / "x.tar.gz")
    with pytest.raises(ValueError, match="plain file names"):
        build_model_tar(artifact_dir, tmp_path / "x.tar.gz", ["../secret"])
    with pytest.raises(FileNotFoundError):
        build_model_tar(tmp_path / "missing", tmp_path / "x.tar.gz")


def _hostile_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as archive:
        member.size = len(data) if member.isfile() else 0
        archive.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


@pytest.mark.parametrize("make_member", [
    lambda: tarfile.TarInfo("../escape.txt"),
    lambda: tarfile.TarInfo("/etc/absolute.txt"),
    lambda: _symlink("link", "/etc/passwd"),
    lambda: _symlink("model-b1.pt", "../../outside"),
])
def test_safe_extract_refuses_escapes_and_links(make_member: object, tmp_path: Path) -> None:
    archive = _hostile_tar(tmp_path / "bad.tar.gz", make_member())  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"escapes|not a regular file"):
        safe_extract(archive, tmp_path / "dest")
    assert not any((tmp_path / "dest").iterdir())


def _symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


def test_safe_extract_restores_the_files(artifact_dir: Path, tmp_path: Path) -> None:
    build_model_tar(artifact_dir, tmp_path / "model.tar.gz")
    written = safe_extract(tmp_path / "model.tar.gz", tmp_path / "opt" / "ml" / "model")
    assert sorted(p.name for p in written) == ["manifest.json", "model-b1.pt", "tokenizer.json"]
    assert (tmp_path / "opt/ml/model/model-b1.pt").read_bytes() == (
        artifact_dir / "model-b1.pt").read_bytes()
