"""artifact-manifest.json: round trip, refusals that name the field, and the directory check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from artifact_manifest import (
    MANIFEST_FILE,
    ArtifactFiles,
    ArtifactMismatch,
    ManifestError,
    NamedAdapter,
    adapter_checksum_in,
    adapter_dir_checksum,
    artifact_files_from_json,
    check_model_dir,
    check_named_adapters,
    describe_files,
    find_mismatch,
    list_artifact_files,
)


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    (root / "adapters" / "manga").mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "model.safetensors").write_bytes(b"\x01" * 4096)
    (root / "adapters" / "manga" / "adapter_config.json").write_text('{"r": 64}')
    return root


def seal(root: Path) -> None:
    (root / MANIFEST_FILE).write_text(describe_files(root, list_artifact_files(root)).to_json())


def test_round_trip_with_sizes_and_digests(artifact: Path) -> None:
    names = list_artifact_files(artifact)
    assert names == ["adapters/manga/adapter_config.json", "config.json", "model.safetensors"]
    files = describe_files(artifact, names)
    assert files.files["model.safetensors"].size == 4096
    assert files.files["model.safetensors"].sha256 == hashlib.sha256(b"\x01" * 4096).hexdigest()
    assert artifact_files_from_json(files.to_json()) == files
    assert files.total_bytes == sum(entry.size for entry in files.files.values())


def test_the_manifest_never_lists_itself(artifact: Path) -> None:
    seal(artifact)
    assert MANIFEST_FILE not in list_artifact_files(artifact)


def test_symlinks_are_refused(artifact: Path) -> None:
    (artifact / "link.json").symlink_to(artifact / "config.json")
    with pytest.raises(ValueError, match=r"link\.json: a symlink"):
        list_artifact_files(artifact)


@pytest.mark.parametrize(("data", "message"), [
    ("not json", "not valid JSON"),
    ({"format_version": 2, "files": {}}, "format_version 2 is not accepted"),
    ({"format_version": 1}, "files: expected an object"),
    ({"format_version": 1, "files": {"../etc/passwd": {"size": 1, "sha256": "0" * 64}}},
     r"'\.\./etc/passwd' is not a plain relative path"),
    ({"format_version": 1, "files": {"/abs": {"size": 1, "sha256": "0" * 64}}},
     "'/abs' is not a relative path"),
    ({"format_version": 1, "files": {"a": {"size": -1, "sha256": "0" * 64}}},
     r"files\['a'\]\.size: -1 is not a byte count"),
    ({"format_version": 1, "files": {"a": {"size": 1, "sha256": "ABC"}}},
     r"files\['a'\]\.sha256: 'ABC' is not a lowercase hex SHA-256"),
])
def test_malformed_manifests_name_the_field(data: object, message: str) -> None:
    text = data if isinstance(data, str) else json.dumps(data)
    with pytest.raises(ManifestError, match=message):
        artifact_files_from_json(text, source="s3://bucket/m.json")


def test_check_passes_reports_and_skips_without_a_manifest(artifact: Path) -> None:
    assert check_model_dir(artifact).files == 0
    assert "not verified" in check_model_dir(artifact).describe()
    seal(artifact)
    result = check_model_dir(artifact)
    assert result.files == 3
    assert "3 files" in result.describe()


def test_sizes_are_checked_before_any_file_is_hashed(artifact: Path) -> None:
    seal(artifact)
    # config.json sorts before model.safetensors: corrupt it (same size) and truncate the other.
    (artifact / "config.json").write_text('{"model_type": "LLAMA"}')
    (artifact / "model.safetensors").write_bytes(b"\x01" * 10)
    with pytest.raises(ArtifactMismatch) as info:
        check_model_dir(artifact)
    assert str(info.value) == ("artifact check: model.safetensors: 10 bytes, but "
                               "artifact-manifest.json says 4096 (an incomplete download or a "
                               "different upload)")


def test_a_changed_file_of_the_same_size_is_named(artifact: Path) -> None:
    seal(artifact)
    (artifact / "adapters" / "manga" / "adapter_config.json").write_text('{"r": 32}')
    problem = find_mismatch(artifact, artifact_files_from_json(
        (artifact / MANIFEST_FILE).read_text()))
    assert problem is not None
    assert problem.startswith("adapters/manga/adapter_config.json: SHA-256 ")
    assert "\n" not in problem


def test_a_broken_manifest_in_the_model_dir_is_one_line(artifact: Path) -> None:
    (artifact / MANIFEST_FILE).write_text("{")
    with pytest.raises(ArtifactMismatch, match=r"^artifact check: .*not valid JSON"):
        check_model_dir(artifact)


def test_a_model_manifest_names_its_adapters_by_checksum(artifact: Path) -> None:
    """The checksum is the same from the folder and from the model manifest's entries."""
    files = describe_files(artifact, list_artifact_files(artifact))
    checksum = adapter_dir_checksum(artifact / "adapters" / "manga")
    assert adapter_checksum_in(files, "manga") == checksum
    assert adapter_checksum_in(files, "support") is None
    named = ArtifactFiles(files=files.files, adapters={"manga": NamedAdapter("manga", checksum)})
    assert artifact_files_from_json(named.to_json()) == named
    # A manifest naming no adapter keeps its old form.
    assert "adapters" not in json.loads(files.to_json())
    (artifact / MANIFEST_FILE).write_text(named.to_json())
    assert check_named_adapters(artifact, artifact / "adapters", [("manga", "manga")]) == 1
    (artifact / "adapters" / "manga" / "adapter_config.json").write_text('{"r": 65}')
    with pytest.raises(ArtifactMismatch, match=r"^adapter check: adapter 'manga' in .*: checksum "):
        check_named_adapters(artifact, artifact / "adapters", [("manga", "manga")])
    with pytest.raises(ArtifactMismatch, match=r"is served from folder 'other', but "
                                               r"artifact-manifest\.json names folder 'manga'"):
        check_named_adapters(artifact, artifact / "adapters", [("manga", "other")])


def test_without_a_manifest_no_adapter_is_checked(artifact: Path) -> None:
    assert check_named_adapters(artifact, artifact / "adapters", [("manga", "manga")]) == 0


@pytest.mark.parametrize(("adapters", "message"), [
    ([], "adapters: expected an object of adapter name -> directory and sha256"),
    ({"manga": {"directory": "../x", "sha256": "0" * 64}},
     "adapters['manga'].directory: '../x' is not accepted; a folder name under adapters/"),
    ({"manga": {"directory": "manga", "sha256": "abc"}},
     "adapters['manga'].sha256: 'abc' is not a lowercase hex SHA-256"),
])
def test_malformed_adapter_entries_name_the_field(adapters: object, message: str) -> None:
    text = json.dumps({"format_version": 1, "files": {}, "adapters": adapters})
    with pytest.raises(ManifestError) as info:
        artifact_files_from_json(text, source="m.json")
    assert str(info.value) == f"m.json: {message}"


def test_the_start_cache_entry_round_trips_and_never_fails_the_model_check(tmp_path: Path) -> None:
    from artifact_manifest import START_CACHE_DIR, start_cache_problem

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / START_CACHE_DIR).mkdir()
    (tmp_path / START_CACHE_DIR / "start-cache.json").write_text("{}")
    described = describe_files(tmp_path, list_artifact_files(tmp_path)).files
    manifest = ArtifactFiles(
        files={p: d for p, d in described.items() if not p.startswith(START_CACHE_DIR)},
        start_cache={p: d for p, d in described.items() if p.startswith(START_CACHE_DIR)})
    assert artifact_files_from_json(manifest.to_json()) == manifest
    (tmp_path / MANIFEST_FILE).write_text(manifest.to_json())
    assert start_cache_problem(tmp_path) is None
    (tmp_path / START_CACHE_DIR / "start-cache.json").write_text("{} ")
    assert "start-cache/start-cache.json" in (start_cache_problem(tmp_path) or "")
    assert check_model_dir(tmp_path).files == 1  # a differing cache never fails the start
    with pytest.raises(ManifestError, match="start_cache: 'x' is not under start-cache/"):
        artifact_files_from_json('{"format_version": 1, "files": {}, "start_cache": {"x": {}}}')
