"""A quantization run's candidate: the gated model with its own artifact-manifest.json.

    python -m quantization.candidate manifest DIR    # write DIR/artifact-manifest.json and
                                                      # print "<path>\\t<sha256>" per file

The job (``containers/quantize/quantize-job``) runs this on the quantized directory once the gate
passes, uploads every listed file with its SHA-256 in the object's metadata (``sha256``, what
``make publish`` writes and ``make preflight`` and ``make promote`` compare), and uploads the
manifest last, so its presence means every file it lists is there. The candidate lives at
``<quantization.candidates_prefix>/<run id>/``; nothing serves it from there.

The manifest also names the LoRA adapters the gate evaluated on this model (``adapters``: name ->
folder and checksum, from ``quality_gate.json``): ``make promote`` copies only those adapters
with it, and the serving container refuses any other (artifact_manifest.check_named_adapters).

Pure module: standard library and ``artifact_manifest``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from artifact_manifest import (
    MANIFEST_FILE,
    ArtifactFiles,
    ManifestError,
    NamedAdapter,
    artifact_files_from_json,
    describe_files,
    list_artifact_files,
)

REQUIRED_FILES: tuple[str, ...] = ("config.json", "tokenizer.json", "tokenizer_config.json",
                                   "quality_gate.json")
"""What a candidate must hold besides its weights: the served tokenizer and the gate's verdict."""


class CandidateError(ValueError):
    """The quantized directory cannot be a candidate; the message names the file."""


def candidate_manifest(model_dir: Path) -> ArtifactFiles:
    """The manifest of every file under ``model_dir``; CandidateError when one is missing."""
    names = list_artifact_files(model_dir)
    missing = [name for name in REQUIRED_FILES if name not in names]
    if missing:
        raise CandidateError(f"{model_dir}: no {', '.join(missing)}: not a complete candidate")
    if not any(name.endswith(".safetensors") for name in names):
        raise CandidateError(f"{model_dir}: no *.safetensors weights: not a complete candidate")
    files = describe_files(model_dir, names).files
    return ArtifactFiles(files=files, adapters=gated_adapters(model_dir / "quality_gate.json"))


def gated_adapters(report_path: Path) -> dict[str, NamedAdapter]:
    """The adapters ``quality_gate.json`` gated (name -> folder and checksum); the job writes a
    candidate only once the gate passed, and make promote checks the verdict again."""
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise CandidateError(f"{report_path}: not valid JSON ({error})") from None
    if not isinstance(report, dict):
        raise CandidateError(f"{report_path}: expected a JSON object")
    sections = report.get("adapters", {})
    if not isinstance(sections, dict):
        raise CandidateError(f"{report_path}: adapters: expected an object of name -> section")
    text = json.dumps({"format_version": 1, "files": {}, "adapters": {
        name: {"directory": section.get("directory"), "sha256": section.get("sha256")}
        for name, section in sections.items() if isinstance(section, dict)}})
    try:
        return dict(artifact_files_from_json(text, source=str(report_path)).adapters)
    except ManifestError as error:
        raise CandidateError(str(error)) from None


def write_manifest(model_dir: Path) -> ArtifactFiles:
    """Write ``model_dir/artifact-manifest.json`` and return what it lists."""
    manifest = candidate_manifest(model_dir)
    (model_dir / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quantization.candidate",
                                     description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    manifest = commands.add_parser("manifest", help="write DIR/artifact-manifest.json")
    manifest.add_argument("model_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        written = write_manifest(args.model_dir)
    except (CandidateError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name in sorted(written.files):
        print(f"{name}\t{written.files[name].sha256}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
