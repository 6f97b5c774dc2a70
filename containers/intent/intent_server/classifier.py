"""Load a compiled intent-classifier artifact and classify texts with it.

Two phases, so that SageMaker sees a clear failure fast and /ping stays cheap:

- :func:`preflight` (milliseconds, before the port opens): read and check manifest.json and
  labels.json, match the image's target, plan the NeuronCores, set the runtime's environment and
  import torch_neuron / torch_neuronx. Any problem stops the process with one clear line.
- :meth:`IntentClassifier.load` (seconds, in the background while /ping answers 503): verify
  checksums, load the tokenizer and one TorchScript per compiled batch size per model copy, and
  warm every copy at every batch size.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from artifact_manifest import sha256_file
from intent_server.batching import call_costs, plan_batches
from intent_server.placement import CorePlan, ReplicaPool, load_order, plan_cores
from intent_server.predictions import Prediction, predict
from intent_server.settings import ServerSettings
from intents import INTENT_LABELS
from neuron.manifest import (
    LABELS_FILE,
    MANIFEST_FILE,
    TOKENIZER_FILE,
    ArtifactManifest,
    ManifestError,
    check_labels,
    labels_from_json,
    manifest_from_json,
)
from neuron.runtime import (
    SdkUnavailableError,
    load_sdk,
    neuron_device_paths,
    require_sdk_installed,
)
from neuron.samples import texts_for_batch
from neuron.tokenization import encode_fixed, load_fixed_length_tokenizer


class ArtifactError(RuntimeError):
    """The model directory cannot be served (missing, inconsistent or corrupt files)."""


@dataclass(frozen=True)
class Preflight:
    """What :func:`preflight` established."""

    manifest: ArtifactManifest
    core_plan: CorePlan


def preflight(settings: ServerSettings, env: MutableMapping[str, str], *,
              dev_dir: str = "/dev") -> Preflight:
    """Check the artifact and the runtime before serving; raise ArtifactError or
    SdkUnavailableError with a message a person can act on.

    ``env`` is the process environment (``os.environ``): the NeuronCore plan's variables are set
    in it before the Neuron runtime is imported, which is when it reads them.
    """
    model_dir = settings.model_dir
    manifest_path = model_dir / MANIFEST_FILE
    if not manifest_path.is_file():
        raise ArtifactError(f"{manifest_path} not found: INTENT_MODEL_DIR must hold the unpacked "
                            "model.tar.gz from neuron/compile.py")
    try:
        manifest = manifest_from_json(manifest_path.read_text(encoding="utf-8"))
        labels = labels_from_json((model_dir / LABELS_FILE).read_text(encoding="utf-8"))
        check_labels(manifest, labels, INTENT_LABELS)
    except FileNotFoundError as error:
        raise ArtifactError(f"{error.filename} not found in {model_dir}") from None
    except ManifestError as error:
        raise ArtifactError(f"{model_dir}: {error}") from None
    problem = manifest.servable_problem
    if problem:
        raise ArtifactError(f"{model_dir}: refusing to serve: {problem}")
    if settings.image_target is not None and settings.image_target is not manifest.target:
        raise ArtifactError(
            f"{model_dir}: the artifact was compiled for {manifest.target.value} but this image "
            f"was built for {settings.image_target.value} (INTENT_TARGET); build the image with "
            f"--build-arg TARGET={manifest.target.value} or compile for "
            f"{settings.image_target.value}")
    for name in (*manifest.model_files.values(), TOKENIZER_FILE):
        if not (model_dir / name).is_file():
            raise ArtifactError(f"{model_dir / name} not found (listed in manifest.json)")
    require_sdk_installed(manifest.target)
    try:
        plan = plan_cores(manifest.target, env,
                          device_count=len(neuron_device_paths(dev_dir)),
                          pipeline_cores=manifest.pipeline_cores,
                          requested_copies=settings.model_copies)
    except ValueError as error:
        raise ArtifactError(str(error)) from None
    for key, value in plan.env_updates.items():
        env[key] = value
    load_sdk(manifest.target)
    return Preflight(manifest=manifest, core_plan=plan)


@dataclass(frozen=True)
class Classification:
    """Predictions for a request, and how long tokenizing + the model took."""

    predictions: list[Prediction]
    latency_ms: float
    model_calls: int


class IntentClassifier:
    """A loaded artifact: tokenizer, labels and a pool of model copies."""

    def __init__(self, manifest: ArtifactManifest, tokenizer: Any,
                 replicas: Sequence[Mapping[int, Any]], *, replica_wait_s: float) -> None:
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.pool: ReplicaPool[Mapping[int, Any]] = ReplicaPool(replicas)
        self.replica_wait_s = replica_wait_s
        self.costs = call_costs(manifest.batch_sizes,
                                {b: s.p50_ms for b, s in manifest.latency.items()})

    @classmethod
    def load(cls, settings: ServerSettings, checked: Preflight,
             log: Any = print) -> IntentClassifier:
        """Verify, load and warm the artifact (the slow part of start-up)."""
        import torch

        manifest = checked.manifest
        model_dir = settings.model_dir
        if settings.verify_checksums:
            for name, expected in manifest.files_sha256.items():
                path = model_dir / name
                if not path.is_file():
                    raise ArtifactError(f"{path} not found (listed in manifest.files_sha256)")
                actual = sha256_file(path)
                if actual != expected:
                    raise ArtifactError(f"{path}: SHA-256 {actual} does not match the manifest's "
                                        f"{expected}; the artifact is corrupt or mixed up")
        tokenizer = load_fixed_length_tokenizer(model_dir / TOKENIZER_FILE,
                                                max_length=manifest.max_seq_length,
                                                pad_id=manifest.pad_token_id)
        plan = checked.core_plan
        replicas: list[dict[int, Any]] = [{} for _ in range(plan.copies)]
        for copy, batch_size in load_order(manifest.batch_sizes, plan.copies):
            path = model_dir / manifest.model_files[batch_size]
            started = time.perf_counter()
            try:
                model = torch.jit.load(str(path))
            except Exception as error:  # TorchScript raises a bare RuntimeError for most faults
                raise ArtifactError(f"{path}: torch.jit.load failed: {error}") from None
            model.eval()
            replicas[copy][batch_size] = model
            log(f"loaded {path.name} (copy {copy + 1}/{plan.copies}) in "
                f"{time.perf_counter() - started:.2f} s")
        classifier = cls(manifest, tokenizer, replicas, replica_wait_s=settings.replica_wait_s)
        classifier.warmup(replicas, calls=settings.warmup_calls, log=log)
        return classifier

    def warmup(self, replicas: Sequence[Mapping[int, Any]], *, calls: int,
               log: Any = print) -> None:
        """Run every copy at every compiled batch size ``calls`` times; check the output."""
        import torch

        for copy, replica in enumerate(replicas):
            for batch_size in self.manifest.batch_sizes:
                batch = encode_fixed(self.tokenizer, texts_for_batch(batch_size, offset=copy))
                input_ids = torch.tensor(batch.input_ids)
                attention_mask = torch.tensor(batch.attention_mask)
                timings_ms: list[float] = []
                for _ in range(calls):
                    started = time.perf_counter()
                    with torch.no_grad():
                        logits = replica[batch_size](input_ids, attention_mask)
                    timings_ms.append((time.perf_counter() - started) * 1000)
                    expected = (batch_size, len(self.manifest.labels))
                    if tuple(logits.shape) != expected or not bool(torch.isfinite(logits).all()):
                        raise ArtifactError(f"warmup: {self.manifest.model_files[batch_size]} "
                                            f"returned shape {tuple(logits.shape)} (expected "
                                            f"{expected}) or non-finite logits")
                log(f"warmup copy {copy + 1} batch {batch_size}: {calls} calls, first "
                    f"{timings_ms[0]:.1f} ms, last {timings_ms[-1]:.1f} ms")

    def classify(self, texts: Sequence[str]) -> Classification:
        """Classify ``texts`` (blocking: call from a worker thread)."""
        import torch

        started = time.perf_counter()
        encoded = encode_fixed(self.tokenizer, texts)
        calls = plan_batches(len(texts), self.costs)
        rows: list[list[float]] = []
        with self.pool.checkout(self.replica_wait_s) as replica:
            for call in calls:
                indices = list(range(call.start, call.start + call.count))
                indices += [call.start] * call.padding  # pad with a real row, discarded below
                input_ids = torch.tensor([encoded.input_ids[i] for i in indices])
                attention_mask = torch.tensor([encoded.attention_mask[i] for i in indices])
                with torch.no_grad():
                    logits = replica[call.batch_size](input_ids, attention_mask)
                rows.extend(logits.float().tolist()[:call.count])
        labels = self.manifest.labels
        predictions = [predict(row, labels, truncated=truncated, tokens=tokens)
                       for row, truncated, tokens in zip(rows, encoded.truncated,
                                                         encoded.token_counts, strict=True)]
        latency_ms = (time.perf_counter() - started) * 1000.0
        return Classification(predictions=predictions, latency_ms=latency_ms,
                              model_calls=len(calls))


def describe_start(checked: Preflight, settings: ServerSettings) -> str:
    """One line for the log at start-up."""
    m = checked.manifest
    return (f"intent classifier: target {m.target.value}, batch sizes {list(m.batch_sizes)} × "
            f"{m.max_seq_length} tokens, {checked.core_plan.reason}, model dir "
            f"{settings.model_dir}, pid {os.getpid()}")


__all__ = [
    "ArtifactError",
    "Classification",
    "IntentClassifier",
    "Preflight",
    "SdkUnavailableError",
    "describe_start",
    "preflight",
]
