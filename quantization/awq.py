"""AWQ W4A16 quantizer: manga-domain calibration in, a checkpoint vLLM loads out.

    python -m quantization.awq --model-dir BASE_DIR --output-dir OUT_DIR \\
        [--backend llm-compressor|autoawq] [--group-size 128|64] \\
        [--num-samples 512] [--max-seq-len 768] [--qa-data quantization/data/manga_qa.jsonl]

Steps (each printed as it starts, with the backend's own per-layer progress bars):

1. load the manga Q&A JSONL and the base model's tokenizer (local files only);
2. build the calibration set in the production chat template (:mod:`quantization.calibration`);
3. run AWQ with the chosen backend — 4-bit weights, asymmetric (zero point), one scale per
   ``group_size`` input channels, ``lm_head`` left in 16 bits;
4. save the compressed checkpoint and the tokenizer;
5. verify the written ``config.json`` declares the requested quantization, measure weight bytes
   of both checkpoints and write ``quantization_manifest.json``.

Backends (same interface, :class:`AwqBackend`):

- ``llm-compressor`` (default): the vLLM project's maintained successor to AutoAWQ.
  ``AWQModifier`` + ``QuantizationModifier`` run through ``oneshot``; the output is
  ``quant_method: compressed-tensors`` / ``pack-quantized``. The model is loaded on the CPU and
  llm-compressor's sequential pipeline onloads one decoder layer at a time to the accelerator
  when there is one, so an 8B model quantizes on a 24 GiB GPU.
- ``autoawq``: deprecated (last release 0.2.9, tested upstream with torch 2.6 / transformers
  4.51); kept for comparison. Output ``quant_method: awq`` (GEMM packing), which vLLM also loads.

Group size 128 is the default (what vLLM's kernels and most published AWQ checkpoints use);
64 keeps more precision for ≈1.5 % more weight bytes — the option the requirements used for
Japanese (docs/design-decisions.md#calibration-set).

Torch and the backends are imported inside the functions that need them: this module imports in
any environment, and runs in the quantization one (``.venv-quant`` / ``containers/quantize``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from quantization.calibration import (
    CalibrationSet,
    CalibrationSettings,
    ChatTokenizer,
    DatasetError,
    MangaQARecord,
    build_calibration_set,
    load_manga_qa_jsonl,
)
from quantization.checkpoint import (
    CheckpointError,
    load_model_config,
    measure_checkpoint_weights,
    memory_reduction,
    read_quantization_format,
)

DEFAULT_QA_DATA = Path(__file__).resolve().parent / "data" / "manga_qa.jsonl"
GROUP_SIZES = (128, 64)
WEIGHT_BITS = 4
MANIFEST_FILE = "quantization_manifest.json"

ProgressFn = Callable[[str], None]


class BackendUnavailable(RuntimeError):
    """The chosen backend's library is not installed in this environment."""


@dataclass(frozen=True)
class AwqSettings:
    """What to quantize how: W4A16, asymmetric, grouped, ``lm_head`` kept in 16 bits."""

    group_size: int = 128
    backend: str = "llm-compressor"
    ignore: tuple[str, ...] = ("lm_head",)

    def __post_init__(self) -> None:
        if self.group_size not in GROUP_SIZES:
            raise ValueError(
                f"group_size: {self.group_size} is not accepted; use 128 (default) or 64 "
                "(higher quality, slightly larger)"
            )
        if self.backend not in BACKENDS:
            raise ValueError(
                f"backend: {self.backend!r} is not accepted; use {' or '.join(BACKENDS)}"
            )


def _stdout(message: str) -> None:
    print(message, flush=True)


def _package_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError as error:
        raise BackendUnavailable(
            f"{distribution} is not installed here; run in the quantization environment "
            "(.venv-quant, built from quantization/requirements.txt) or the containers/quantize "
            "image"
        ) from error


def _accelerator(torch: Any) -> str:
    if torch.accelerator.is_available():
        return str(torch.accelerator.current_accelerator())
    return "cpu"


@contextlib.contextmanager
def _cpu_pinned_memory_workaround(torch: Any) -> Iterator[None]:
    """Let llm-compressor 0.14.0.1's AWQ run on a machine without an accelerator.

    ``AWQModifier._apply_smoothing`` pins its cached activations unconditionally
    (``IntermediatesCache.pin_memory``), and on a CPU-only torch 2.13 ``Tensor.pin_memory()``
    raises ``RuntimeError: Cannot access accelerator device when none is available.``.
    Pinning only speeds up host→device copies, which do not exist without a device, so on such
    machines it is skipped for the duration of the run; with an accelerator nothing changes.
    """
    if torch.accelerator.is_available():
        yield
        return
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory

    def skip_pinning(self: Any, batch_index: int, input_names: Any = None) -> None:
        return None

    IntermediatesCache.pin_memory = skip_pinning
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original


class AwqBackend:
    """A library that applies AWQ and writes a vLLM-loadable checkpoint.

    What the back-ends share is here: the pinned package checked, the device chosen and said,
    the run announced; each back-end's :meth:`_check`, :meth:`_device` and :meth:`_run` differ."""

    name: str
    distribution: str
    label: str
    """How the progress lines name the library."""

    def quantize(
        self,
        model_dir: Path,
        calibration: CalibrationSet,
        settings: AwqSettings,
        output_dir: Path,
        progress: ProgressFn,
    ) -> str:
        """Quantize ``model_dir`` into ``output_dir`` (weights + config); return the device."""
        _package_version(self.distribution)
        import torch

        self._check(calibration)
        device = self._device(torch)
        progress(f"[quantize] {self.label} on {device}: loading {model_dir}")
        self._run(model_dir, calibration, settings, output_dir, progress)
        return device

    def _check(self, calibration: CalibrationSet) -> None:
        """Refuse a calibration set this library cannot use (ValueError), before loading."""

    def _device(self, torch: Any) -> str:
        return _accelerator(torch)

    def _run(self, model_dir: Path, calibration: CalibrationSet, settings: AwqSettings,
             output_dir: Path, progress: ProgressFn) -> None:
        raise NotImplementedError

    @staticmethod
    def _announce(settings: AwqSettings, samples: int, progress: ProgressFn) -> None:
        progress(f"[quantize] AWQ W{WEIGHT_BITS}A16 group {settings.group_size} over "
                 f"{samples} samples")


class LlmCompressorBackend(AwqBackend):
    """AWQ through llm-compressor's ``oneshot`` (the default)."""

    name = "llm-compressor"
    distribution = "llmcompressor"
    label = "llm-compressor"

    def _run(self, model_dir: Path, calibration: CalibrationSet, settings: AwqSettings,
             output_dir: Path, progress: ProgressFn) -> None:
        """Run AWQModifier + QuantizationModifier over the calibration token ids."""
        import torch
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
        from datasets import Dataset
        from llmcompressor import oneshot
        from llmcompressor.modifiers.quantization import QuantizationModifier
        from llmcompressor.modifiers.transform.awq import AWQModifier
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype="auto", local_files_only=True
        )
        token_ids = calibration.token_id_lists()
        dataset = Dataset.from_dict(
            {"input_ids": token_ids, "attention_mask": [[1] * len(ids) for ids in token_ids]}
        )
        scheme = QuantizationScheme(
            targets=["Linear"],
            weights=QuantizationArgs(
                num_bits=WEIGHT_BITS,
                type="int",
                symmetric=False,
                strategy="group",
                group_size=settings.group_size,
            ),
        )
        recipe = [
            # Mappings are inferred for Llama: input norm → q/k/v, v → o, post-attention
            # norm → gate/up, up → down (the smoothing pairs of the AWQ paper).
            AWQModifier(),
            QuantizationModifier(config_groups={"group_0": scheme}, ignore=list(settings.ignore)),
        ]
        self._announce(settings, len(token_ids), progress)
        with _cpu_pinned_memory_workaround(torch):
            oneshot(
                model=model,
                dataset=dataset,
                recipe=recipe,
                num_calibration_samples=len(token_ids),
                max_seq_length=calibration.settings.max_seq_len,
                shuffle_calibration_samples=False,
            )
        progress(f"[quantize] saving compressed checkpoint to {output_dir}")
        model.save_pretrained(str(output_dir), save_compressed=True)


class AutoAwqBackend(AwqBackend):
    """AWQ through AutoAWQ 0.2.9 (deprecated; kept behind the same interface)."""

    name = "autoawq"
    distribution = "autoawq"
    label = "AutoAWQ"

    def _check(self, calibration: CalibrationSet) -> None:
        max_seq_len = calibration.settings.max_seq_len
        total_tokens = calibration.stats.total_tokens
        if total_tokens < max_seq_len:
            # AutoAWQ concatenates the samples and cuts them into max_seq_len blocks.
            raise ValueError(
                f"max_seq_len: AutoAWQ needs at least {max_seq_len} calibration tokens in all, "
                f"got {total_tokens}; add samples or lower max_seq_len"
            )

    def _device(self, torch: Any) -> str:
        return "cuda" if torch.cuda.is_available() else "cpu"

    def _run(self, model_dir: Path, calibration: CalibrationSet, settings: AwqSettings,
             output_dir: Path, progress: ProgressFn) -> None:
        """Run ``AutoAWQForCausalLM.quantize`` with the calibration token ids."""
        from awq import AutoAWQForCausalLM

        model = AutoAWQForCausalLM.from_pretrained(str(model_dir), safetensors=True)
        extra_ignored = [name for name in settings.ignore if name != "lm_head"]
        quant_config = {
            "zero_point": True,
            "q_group_size": settings.group_size,
            "w_bit": WEIGHT_BITS,
            "version": "GEMM",
            "modules_to_not_convert": extra_ignored or None,
        }
        self._announce(settings, calibration.stats.num_samples, progress)
        model.quantize(
            None,  # unused: calib_data is already token ids
            quant_config=quant_config,
            calib_data=calibration.token_id_lists(),
            max_calib_samples=calibration.stats.num_samples,
            max_calib_seq_len=calibration.settings.max_seq_len,
        )
        progress(f"[quantize] saving AWQ checkpoint to {output_dir}")
        model.save_quantized(str(output_dir), safetensors=True)


BACKENDS: dict[str, AwqBackend] = {
    LlmCompressorBackend.name: LlmCompressorBackend(),
    AutoAwqBackend.name: AutoAwqBackend(),
}


@dataclass(frozen=True)
class QuantizationResult:
    """What a run produced; also written as ``quantization_manifest.json``."""

    output_dir: str
    backend: str
    backend_version: str
    device: str
    settings: dict[str, object]
    calibration: dict[str, object]
    quant_method: str
    group_size: int | None
    baseline_weight_bytes: int
    quantized_weight_bytes: int
    weight_memory_reduction: float
    elapsed_s: float


def _prepare_output_dir(output_dir: Path, overwrite: bool) -> None:
    if output_dir.exists() and any(output_dir.iterdir()):
        if not overwrite:
            raise ValueError(
                f"output_dir: {output_dir} is not empty; pass --overwrite to replace it"
            )
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)


def verify_quantized_checkpoint(output_dir: Path, settings: AwqSettings) -> tuple[str, int | None]:
    """Check the written config declares 4-bit weights with the requested group size."""
    declared = read_quantization_format(load_model_config(output_dir))
    if declared is None:
        raise CheckpointError(f"{output_dir}/config.json: no quantization_config was written")
    if declared.bits != WEIGHT_BITS or declared.group_size != settings.group_size:
        raise CheckpointError(
            f"{output_dir}/config.json: declares {declared.bits}-bit group {declared.group_size}, "
            f"expected {WEIGHT_BITS}-bit group {settings.group_size}"
        )
    return declared.quant_method, declared.group_size


def _calibration_set(records: Sequence[MangaQARecord], tokenizer: ChatTokenizer,
                     calibration_settings: CalibrationSettings, calibration_dump: Path | None,
                     progress: ProgressFn) -> CalibrationSet:
    """Step 2: the calibration set in the production chat template, reported and optionally
    written out as JSON lines."""
    progress("[quantize] 2/5 building the calibration set in the production chat template")
    calibration = build_calibration_set(records, tokenizer, calibration_settings)
    stats = calibration.stats
    if stats.num_samples < calibration_settings.num_samples:
        progress(
            f"[quantize]     only {len(records)} records: calibrating on all of them "
            f"(asked for {calibration_settings.num_samples})"
        )
    progress(
        f"[quantize]     {stats.num_samples} samples (ja {stats.by_language['ja']}, "
        f"en {stats.by_language['en']}), {stats.total_tokens} tokens, "
        f"{stats.min_tokens}–{stats.max_tokens} per sample, {stats.truncated} truncated "
        f"at {stats.max_seq_len}"
    )

    if calibration_dump is not None:
        calibration_dump.write_text(
            "".join(
                json.dumps(row, ensure_ascii=False) + "\n" for row in calibration.to_jsonl_rows()
            ),
            encoding="utf-8",
        )
        progress(f"[quantize]     calibration texts written to {calibration_dump}")
    return calibration


def quantize_model(
    model_dir: Path,
    output_dir: Path,
    *,
    settings: AwqSettings,
    calibration_settings: CalibrationSettings,
    qa_data: Path = DEFAULT_QA_DATA,
    overwrite: bool = False,
    calibration_dump: Path | None = None,
    progress: ProgressFn = _stdout,
) -> QuantizationResult:
    """Run the five steps of the module docstring and return what was produced."""
    from quantization.chat_tokenizer import HuggingFaceChatTokenizer

    started = time.monotonic()
    backend = BACKENDS[settings.backend]
    backend_version = _package_version(backend.distribution)
    baseline = measure_checkpoint_weights(model_dir)
    _prepare_output_dir(output_dir, overwrite)

    progress(f"[quantize] 1/5 loading Q&A data {qa_data} and the tokenizer of {model_dir}")
    records = load_manga_qa_jsonl(qa_data)
    tokenizer = HuggingFaceChatTokenizer.from_model_dir(model_dir)

    calibration = _calibration_set(records, tokenizer, calibration_settings, calibration_dump,
                                   progress)
    stats = calibration.stats

    progress(f"[quantize] 3/5 AWQ with {backend.name} {backend_version}")
    device = backend.quantize(model_dir, calibration, settings, output_dir, progress)

    progress("[quantize] 4/5 saving tokenizer files")
    tokenizer.hf_tokenizer.save_pretrained(str(output_dir))

    progress("[quantize] 5/5 verifying the checkpoint and measuring weight memory")
    quant_method, group_size = verify_quantized_checkpoint(output_dir, settings)
    quantized = measure_checkpoint_weights(output_dir)
    result = QuantizationResult(
        output_dir=str(output_dir),
        backend=backend.name,
        backend_version=backend_version,
        device=device,
        settings=asdict(settings),
        calibration=stats.as_dict(),
        quant_method=quant_method,
        group_size=group_size,
        baseline_weight_bytes=baseline.tensor_bytes,
        quantized_weight_bytes=quantized.tensor_bytes,
        weight_memory_reduction=round(
            memory_reduction(baseline.tensor_bytes, quantized.tensor_bytes), 6
        ),
        elapsed_s=round(time.monotonic() - started, 2),
    )
    (output_dir / MANIFEST_FILE).write_text(
        json.dumps(asdict(result), ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    progress(
        f"[quantize] done in {result.elapsed_s:.1f} s: {quant_method} group {group_size}, "
        f"weights {baseline.tensor_bytes:,} → {quantized.tensor_bytes:,} bytes "
        f"({result.weight_memory_reduction * 100:.1f} % less)"
    )
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m quantization.awq",
        description="AWQ W4A16 quantization calibrated on manga Q&A in the production template.",
    )
    parser.add_argument("--model-dir", type=Path, required=True, help="bf16 base model directory")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--backend", default="llm-compressor", help="llm-compressor or autoawq")
    parser.add_argument("--group-size", type=int, default=128, help="128 (default) or 64")
    parser.add_argument("--num-samples", type=int, default=512)
    parser.add_argument("--max-seq-len", type=int, default=768, help="tokens per sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--qa-data", type=Path, default=DEFAULT_QA_DATA)
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output dir")
    parser.add_argument(
        "--dump-calibration", type=Path, help="also write the rendered calibration texts (JSONL)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0 on success, 2 on bad input or a missing backend."""
    args = _parser().parse_args(argv)
    try:
        settings = AwqSettings(group_size=args.group_size, backend=args.backend)
        calibration_settings = CalibrationSettings(
            num_samples=args.num_samples, max_seq_len=args.max_seq_len, seed=args.seed
        )
        quantize_model(
            args.model_dir,
            args.output_dir,
            settings=settings,
            calibration_settings=calibration_settings,
            qa_data=args.qa_data,
            overwrite=args.overwrite,
            calibration_dump=args.dump_calibration,
        )
    except (ValueError, DatasetError, CheckpointError, BackendUnavailable, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
