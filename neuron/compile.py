"""Compile the DistilBERT intent classifier for inf1, inf2 or cpu and package model.tar.gz.

    python -m neuron.compile --target inf1|inf2|cpu --model-dir DIR --out DIR

Loads a Hugging Face DistilBERT sequence classifier and its tokenizer from a local directory,
traces it at fixed shapes (each --batch-sizes entry × --seq-length tokens, padded) with
torch-neuron (inf1), torch-neuronx (inf2) or torch.jit.trace (cpu), reloads every saved
TorchScript and checks its logits against the eager model on sample manga queries (max |Δlogit|
bounded by --parity-bound), measures p50/p99 latency, writes the artifact to OUT/model
(model-b<N>.pt, tokenizer, labels.json, manifest.json, artifact-manifest.json) and packs
OUT/model.tar.gz in SageMaker's layout.

inf1 and inf2 need their Neuron SDK, which only exists inside the Neuron images: without it the
command stops at once and names the image (see docs/intent.md). Exit status: 0 compiled,
1 parity over the bound (nothing packaged), 2 bad arguments or model directory,
3 SDK or Neuron device missing.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from artifact_manifest import MANIFEST_FILE as ARTIFACT_MANIFEST_FILE
from artifact_manifest import describe_files, list_artifact_files
from intents import INTENT_LABELS
from neuron.latency import LatencyStats, format_latency_table
from neuron.manifest import (
    LABELS_FILE,
    MANIFEST_FILE,
    TOKENIZER_FILE,
    ArtifactManifest,
    model_file_name,
)
from neuron.model_archive import build_model_tar, files_digest_map, tar_bytes_summary
from neuron.parity import ParityReport, compare_logits, worst_of
from neuron.samples import parity_texts
from neuron.targets import CompileTarget, profile
from neuron.tokenization import encode_fixed, load_fixed_length_tokenizer
from neuron.tracing import (
    SdkUnavailableError,
    installed_versions,
    load_sdk,
    logits_module,
    require_neuron_device,
    trace_for_target,
)

EXIT_OK, EXIT_PARITY, EXIT_USAGE, EXIT_ENVIRONMENT = 0, 1, 2, 3
MAX_BATCH_SIZE = 64
ARTIFACT_SUBDIR = "model"
TAR_NAME = "model.tar.gz"


class UsageError(ValueError):
    """A bad argument or model directory: exit 2 with a one-line message."""


class Progress:
    """Numbered, timed progress lines on stderr (the compile of a real model takes minutes)."""

    def __init__(self, total_steps: int, stream: TextIO | None = None) -> None:
        self.total_steps = total_steps
        self.step = 0
        self.started = time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr

    def next(self, message: str) -> None:
        """Announce the next step."""
        self.step += 1
        self.say(f"[{self.step}/{self.total_steps}] {message}")

    def say(self, message: str) -> None:
        """A line prefixed with the elapsed time."""
        elapsed = time.perf_counter() - self.started
        print(f"[compile {elapsed:6.1f}s] {message}", file=self.stream, flush=True)


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """"1,8" → (1, 8); raise UsageError naming the value and what is accepted."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UsageError(f"--batch-sizes: {text!r} is not a comma-separated list of "
                         "integers") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_BATCH_SIZE:
        raise UsageError(f"--batch-sizes: {text!r}; accepted: integers 1..{MAX_BATCH_SIZE}")
    return tuple(sizes)


def build_parser() -> argparse.ArgumentParser:
    """The command line (documented in docs/intent.md)."""
    parser = argparse.ArgumentParser(
        prog="python -m neuron.compile", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--target", required=True, choices=[t.value for t in CompileTarget])
    parser.add_argument("--model-dir", required=True, type=Path,
                        help="Hugging Face DistilBERT sequence-classifier directory")
    parser.add_argument("--out", required=True, type=Path,
                        help="writes OUT/model/ and OUT/model.tar.gz")
    parser.add_argument("--batch-sizes", default="1,8",
                        help="compiled batch sizes, comma-separated")
    parser.add_argument("--seq-length", type=int, default=128,
                        help="tokens per text (longer input is truncated, shorter padded)")
    parser.add_argument("--parity-bound", type=float, default=None,
                        help="max |Δlogit| accepted (default: 1e-4 cpu, 0.05 inf1/inf2)")
    parser.add_argument("--pipeline-cores", type=int, default=1,
                        help="inf1 only: NeuronCores one model copy is pipelined over")
    parser.add_argument("--compiler-arg", action="append", default=[],
                        help="extra neuron-cc / neuronx-cc argument, repeatable; "
                             "write --compiler-arg=--flag")
    parser.add_argument("--latency-iterations", type=int, default=50)
    parser.add_argument("--latency-warmup", type=int, default=5)
    parser.add_argument("--skip-device-checks", action="store_true",
                        help="inf1/inf2 on a host without a NeuronCore: compile and package "
                             "without parity or latency (recorded in the manifest)")
    parser.add_argument("--trust-label-order", action="store_true",
                        help="accept a head labelled LABEL_0..LABEL_7 as being in the order of "
                             "intents.INTENT_LABELS")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing OUT/model and OUT/model.tar.gz")
    return parser


def validate_args(args: argparse.Namespace) -> tuple[CompileTarget, tuple[int, ...], float]:
    """Check everything that can be checked before loading anything."""
    target = CompileTarget(args.target)
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    if not 8 <= args.seq_length <= 512:
        raise UsageError(f"--seq-length: {args.seq_length!r}; accepted: 8..512")
    bound = args.parity_bound if args.parity_bound is not None else (
        profile(target).default_parity_bound)
    if not bound > 0:
        raise UsageError(f"--parity-bound: {bound!r} must be > 0")
    if args.pipeline_cores < 1:
        raise UsageError(f"--pipeline-cores: {args.pipeline_cores!r} must be at least 1")
    if args.pipeline_cores > 1 and not profile(target).supports_pipeline_cores:
        raise UsageError(f"--pipeline-cores {args.pipeline_cores}: NeuronCore Pipeline exists "
                         f"only for inf1 (neuron-cc), not {target.value}")
    if args.compiler_arg and target is CompileTarget.CPU:
        raise UsageError("--compiler-arg applies to inf1/inf2 only")
    if args.latency_iterations < 1 or args.latency_warmup < 0:
        raise UsageError("--latency-iterations must be >= 1 and --latency-warmup >= 0")
    if args.skip_device_checks and target is CompileTarget.CPU:
        raise UsageError("--skip-device-checks applies to inf1/inf2 only")
    if not (args.model_dir / "config.json").is_file():
        raise UsageError(f"--model-dir: {args.model_dir} has no config.json; expected a Hugging "
                         "Face model directory (save_pretrained output)")
    artifact_dir = args.out / ARTIFACT_SUBDIR
    if not args.overwrite and (artifact_dir.exists() or (args.out / TAR_NAME).exists()):
        raise UsageError(f"--out: {artifact_dir} or {args.out / TAR_NAME} already exists; "
                         "pass --overwrite to replace them")
    return target, batch_sizes, bound


def check_head_labels(config: Any, *, trust_label_order: bool) -> None:
    """The classifier head must answer in INTENT_LABELS order, or the router gets wrong intents."""
    num_labels = int(config.num_labels)
    if num_labels != len(INTENT_LABELS):
        raise UsageError(f"model head has {num_labels} labels; the router has "
                         f"{len(INTENT_LABELS)}: {', '.join(INTENT_LABELS)}")
    names = [str(config.id2label[i]) for i in range(num_labels)]
    if names == list(INTENT_LABELS):
        return
    if trust_label_order and names == [f"LABEL_{i}" for i in range(num_labels)]:
        return
    raise UsageError(f"model config id2label {names} does not match intents.INTENT_LABELS "
                     f"{list(INTENT_LABELS)}; set id2label when fine-tuning (or pass "
                     "--trust-label-order for generic LABEL_i names)")


def _rows(tensor: Any) -> list[list[float]]:
    return [[float(v) for v in row] for row in tensor.detach().float().cpu().tolist()]


def _chunks(count: int, size: int) -> list[list[int]]:
    """Indices 0..count-1 in groups of exactly ``size``; the last group repeats index 0."""
    groups = [list(range(start, min(start + size, count))) for start in range(0, count, size)]
    groups[-1] += [0] * (size - len(groups[-1]))
    return groups


def run(args: argparse.Namespace, progress: Progress) -> int:
    """The compile pipeline; returns the exit status."""
    target, batch_sizes, bound = validate_args(args)
    device_checks = not args.skip_device_checks
    prof = profile(target)

    progress.next(f"checking the {target.value} toolchain ({prof.compiler_name})")
    sdk = load_sdk(target)
    if device_checks:
        require_neuron_device(target)

    progress.next(f"loading {args.model_dir}")
    hf_tokenizer, hf_model, pad_id = _load_model(args)
    artifact_dir = _fresh_artifact_dir(args, hf_tokenizer)
    samples = _reference_samples(args, hf_tokenizer, hf_model, artifact_dir, pad_id, progress)

    compiled = _Compiled()
    for batch_size in batch_sizes:
        progress.next(f"tracing batch {batch_size} × {args.seq_length} with "
                      f"{prof.compiler_name}")
        traced = trace_for_target(target, samples.module, samples.example(batch_size), sdk=sdk,
                                  pipeline_cores=args.pipeline_cores,
                                  compiler_args=args.compiler_arg)
        file_name = compiled.save(batch_size, traced, artifact_dir)
        if not device_checks:
            progress.say(f"  saved {file_name} (no parity/latency: --skip-device-checks)")
            continue
        compiled.check(batch_size, artifact_dir / file_name, samples, args, bound, progress)

    parity = worst_of(compiled.parity_reports) if compiled.parity_reports else None
    progress.next("writing labels.json and manifest.json")
    _write_manifests(args, target, batch_sizes, int(pad_id), artifact_dir, compiled, parity)
    if compiled.latency:
        progress.say("  latency of the compiled model:\n" + format_latency_table(
            [compiled.latency[b] for b in sorted(compiled.latency)]))

    if parity is not None and not parity.passed:
        progress.say(f"error: parity failed for {target.value}: {parity.describe()}; "
                     f"nothing packaged (see {artifact_dir / MANIFEST_FILE})")
        return EXIT_PARITY

    progress.next(f"packaging {args.out / TAR_NAME}")
    digest = build_model_tar(artifact_dir, args.out / TAR_NAME)
    progress.say(f"  {tar_bytes_summary(args.out / TAR_NAME)}, sha256 {digest}")
    progress.say(f"done: {target.value} artifact in {artifact_dir}")
    return EXIT_OK


def _load_model(args: argparse.Namespace) -> tuple[Any, Any, int]:
    """The tokenizer and the eager float32 classifier, checked: head labels in the router's
    order, --seq-length within the model's positions, a pad token."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))
    hf_model = AutoModelForSequenceClassification.from_pretrained(
        str(args.model_dir), attn_implementation="eager")
    hf_model = hf_model.float().eval()
    check_head_labels(hf_model.config, trust_label_order=args.trust_label_order)
    max_positions = int(getattr(hf_model.config, "max_position_embeddings", args.seq_length))
    if args.seq_length > max_positions:
        raise UsageError(f"--seq-length {args.seq_length} exceeds the model's "
                         f"max_position_embeddings {max_positions}")
    pad_id = hf_tokenizer.pad_token_id
    if pad_id is None:
        raise UsageError(f"{args.model_dir}: the tokenizer has no pad token")
    return hf_tokenizer, hf_model, pad_id


def _fresh_artifact_dir(args: argparse.Namespace, hf_tokenizer: Any) -> Path:
    """OUT/model emptied (and OUT/model.tar.gz removed), holding the fast tokenizer."""
    artifact_dir = args.out / ARTIFACT_SUBDIR
    if artifact_dir.exists():
        shutil.rmtree(artifact_dir)
    (args.out / TAR_NAME).unlink(missing_ok=True)
    artifact_dir.mkdir(parents=True)
    hf_tokenizer.save_pretrained(str(artifact_dir))
    if not (artifact_dir / TOKENIZER_FILE).is_file():
        raise UsageError(f"{args.model_dir}: the tokenizer has no fast (tokenizers) form; the "
                         f"server needs {TOKENIZER_FILE}")
    return artifact_dir


@dataclass(frozen=True)
class _Samples:
    """The parity queries as the server encodes them, and the eager model's logits for them."""

    texts: Sequence[str]
    input_ids: Any
    attention_mask: Any
    module: Any
    """The eager model as a (input_ids, attention_mask) -> logits module: what gets traced."""
    eager_logits: list[list[float]]

    def example(self, batch_size: int) -> tuple[Any, Any]:
        """The first ``batch_size`` samples (padded by repeating the first), as tracing input."""
        rows = _chunks(len(self.texts), batch_size)[0]
        return self.input_ids[rows], self.attention_mask[rows]


def _reference_samples(args: argparse.Namespace, hf_tokenizer: Any, hf_model: Any,
                       artifact_dir: Path, pad_id: int, progress: Progress) -> _Samples:
    """Tokenize the samples with the tokenizer the server loads (it must agree with the model
    directory's) and compute the eager reference logits."""
    import torch

    texts = parity_texts()
    progress.next(f"tokenizing {len(texts)} sample queries at {args.seq_length} tokens "
                  "and computing eager reference logits")
    served_tokenizer = load_fixed_length_tokenizer(
        artifact_dir / TOKENIZER_FILE, max_length=args.seq_length, pad_id=pad_id)
    batch = encode_fixed(served_tokenizer, texts)
    reference_ids = hf_tokenizer(texts, padding="max_length", truncation=True,
                                 max_length=args.seq_length)["input_ids"]
    for index, (served, expected) in enumerate(zip(batch.input_ids, reference_ids, strict=True)):
        if list(served) != list(expected):
            raise UsageError(f"sample {index}: {TOKENIZER_FILE} encodes {texts[index]!r} "
                             "differently from the model directory's tokenizer")
    input_ids = torch.tensor(batch.input_ids, dtype=torch.long)
    attention_mask = torch.tensor(batch.attention_mask, dtype=torch.long)
    module = logits_module(hf_model)
    with torch.no_grad():
        eager_logits = _rows(module(input_ids, attention_mask))
    progress.say(f"  {sum(batch.truncated)} of {len(texts)} samples truncated to "
                 f"{args.seq_length} tokens")
    return _Samples(texts=texts, input_ids=input_ids, attention_mask=attention_mask,
                    module=module, eager_logits=eager_logits)


@dataclass
class _Compiled:
    """The TorchScript file per batch size, and its parity and latency once checked."""

    model_files: dict[int, str] = field(default_factory=dict)
    parity_reports: list[ParityReport] = field(default_factory=list)
    latency: dict[int, LatencyStats] = field(default_factory=dict)

    def save(self, batch_size: int, traced: Any, artifact_dir: Path) -> str:
        """Save one traced model; returns its file name."""
        import torch

        file_name = model_file_name(batch_size)
        torch.jit.save(traced, str(artifact_dir / file_name))
        self.model_files[batch_size] = file_name
        return file_name

    def check(self, batch_size: int, path: Path, samples: _Samples, args: argparse.Namespace,
              bound: float, progress: Progress) -> None:
        """Reload the saved file (what the server will load), compare its logits with the eager
        ones on every sample, and measure its latency."""
        import torch

        loaded = torch.jit.load(str(path))
        compiled_rows: list[list[float]] = [[] for _ in samples.texts]
        with torch.no_grad():
            for group in _chunks(len(samples.texts), batch_size):
                logits = _rows(loaded(samples.input_ids[group], samples.attention_mask[group]))
                for row_index, text_index in enumerate(group):
                    if not compiled_rows[text_index]:
                        compiled_rows[text_index] = logits[row_index]
        report = compare_logits(samples.eager_logits, compiled_rows, bound=bound)
        self.parity_reports.append(report)
        progress.say(f"  parity (saved and reloaded {path.name}): {report.describe()}")
        example_ids, example_mask = samples.example(batch_size)
        self.latency[batch_size] = measure_latency(
            loaded, example_ids, example_mask, batch_size=batch_size,
            warmup=args.latency_warmup, iterations=args.latency_iterations, progress=progress)


def _write_manifests(args: argparse.Namespace, target: CompileTarget,
                     batch_sizes: tuple[int, ...], pad_id: int, artifact_dir: Path,
                     compiled: _Compiled, parity: ParityReport | None) -> None:
    """labels.json, manifest.json (what was compiled and how it measured) and
    artifact-manifest.json (size and SHA-256 of every file)."""
    (artifact_dir / LABELS_FILE).write_text(json.dumps(list(INTENT_LABELS)) + "\n",
                                            encoding="utf-8")
    versions = installed_versions(target)
    versions["python"] = platform.python_version()
    notes = [] if not args.skip_device_checks else [
        "compiled with --skip-device-checks: parity and latency were not measured"]
    manifest = ArtifactManifest(
        target=target, labels=tuple(INTENT_LABELS), max_seq_length=args.seq_length,
        batch_sizes=batch_sizes, model_files=compiled.model_files, pad_token_id=pad_id,
        pipeline_cores=args.pipeline_cores, compiler=profile(target).compiler_name,
        versions=versions, parity=parity, latency=compiled.latency,
        files_sha256=files_digest_map(artifact_dir, sorted(
            p.name for p in artifact_dir.iterdir()
            if p.name not in (MANIFEST_FILE, ARTIFACT_MANIFEST_FILE))),
        source_model=args.model_dir.resolve().name, created_unix_s=int(time.time()),
        notes=tuple(notes))
    (artifact_dir / MANIFEST_FILE).write_text(manifest.to_json(), encoding="utf-8")
    # Size and SHA-256 of every file, manifest.json included: the serving container checks the
    # unpacked archive against it before it starts (artifact_manifest.check_model_dir).
    (artifact_dir / ARTIFACT_MANIFEST_FILE).write_text(
        describe_files(artifact_dir, list_artifact_files(artifact_dir)).to_json(),
        encoding="utf-8")


def measure_latency(model: Any, input_ids: Any, attention_mask: Any, *, batch_size: int,
                    warmup: int, iterations: int, progress: Progress) -> LatencyStats:
    """Time ``iterations`` calls after ``warmup`` untimed ones; progress every ~quarter."""
    import torch

    samples_ms: list[float] = []
    report_every = max(1, iterations // 4)
    with torch.no_grad():
        for _ in range(warmup):
            model(input_ids, attention_mask)
        for index in range(iterations):
            started = time.perf_counter()
            model(input_ids, attention_mask)
            samples_ms.append((time.perf_counter() - started) * 1000.0)
            if (index + 1) % report_every == 0 or index + 1 == iterations:
                progress.say(f"  latency batch {batch_size}: {index + 1}/{iterations} calls")
    return LatencyStats.from_samples_ms(samples_ms, batch_size=batch_size)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    args = build_parser().parse_args(argv)
    try:
        total_steps = 5 + len(parse_batch_sizes(args.batch_sizes))
        return run(args, Progress(total_steps))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except SdkUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ENVIRONMENT


if __name__ == "__main__":
    sys.exit(main())
