"""A quantization run's candidate: the gated model with its own artifact-manifest.json.

    python -m quantization.candidate manifest DIR    # write DIR/artifact-manifest.json and
                                                      # print "<path>\\t<sha256>" per file

The job (``containers/quantize/quantize-job``) runs this on the quantized directory once the gate
passes, uploads every listed file with its SHA-256 in the object's metadata (``sha256``, what
``make publish`` writes and ``make preflight`` and ``make promote`` compare), and uploads the
manifest last, so its presence means every file it lists is there. The candidate lives at
``<quantization.candidates_prefix>/<run id>/``; nothing serves it from there.

Pure module: standard library and ``artifact_manifest``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from artifact_manifest import MANIFEST_FILE, ArtifactFiles, describe_files, list_artifact_files

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
    return describe_files(model_dir, names)


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
