"""What `make publish` checks before it uploads a byte, and what it will upload where.

Every check returns problems, one line each, naming the file, what is wrong and what the settings
expect; the CLI prints them all and uploads nothing when there is any:

* the base model directory: ``config.json`` (whose architecture must be the one the GPU budget
  planned for, ``llm.model.config``), ``tokenizer.json`` and ``tokenizer_config.json``,
  safetensors weights (every shard of an index), and the quantization its ``config.json``
  declares (``quantization_config.quant_method``, bits, group size) must be
  ``llm.model.quantization``;
* each configured adapter (``<ADAPTERS>/<directory>/``): ``adapter_config.json`` with a LoRA
  rank ``r`` within the GPU budget's ``max_lora_rank`` (vLLM sizes every slot for it, and
  refuses a larger adapter at load) and a ``base_model_name_or_path`` naming
  ``llm.model.base_model``; ``adapter_model.safetensors``;
* the intent archive: the ``manifest.json`` neuron/compile.py wrote inside it must name the
  settings' target (an inf2 archive on inf1 cannot load), its parity must have passed, its labels
  must be the router's, and its files must match the ``artifact-manifest.json`` packed with them
  (which the container checks again at start).

Pure module: reads local files, no AWS.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from artifact_manifest import (
    MANIFEST_FILE,
    START_CACHE_DIR,
    ArtifactFiles,
    FileDigest,
    ManifestError,
    NamedAdapter,
    adapter_checksum_in,
    artifact_files_from_json,
    find_mismatch,
    list_artifact_files,
    sha256_file,
)
from gpu_budget import MemoryPlan, parse_quantization
from intents import INTENT_LABELS
from neuron.manifest import MANIFEST_FILE as NEURON_MANIFEST_FILE
from neuron.manifest import ManifestError as NeuronManifestError
from neuron.manifest import check_labels, labels_from_json, manifest_from_json
from neuron.model_archive import safe_extract
from quantization.checkpoint import (
    CheckpointError,
    load_model_config,
    read_quantization_format,
    weight_files,
)
from stacks.artifact_layout import ADAPTERS_DIR, ArtifactLayout, ModelArtifact
from stacks.settings import REPO_ROOT, IntentEndpointSettings, LlmEndpointSettings

TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")
"""The gateway counts tokens with tokenizer.json; vLLM reads the chat template and special
tokens from tokenizer_config.json."""

ARCHITECTURE_KEYS: tuple[str, ...] = (
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "vocab_size",
)
"""config.json fields that must equal the model config the GPU budget planned with."""

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


# --- the base model ---------------------------------------------------------------------------


def check_base_model(model_dir: Path, settings: LlmEndpointSettings) -> list[str]:
    """Problems with the base model directory (empty when it can be published)."""
    if not model_dir.is_dir():
        return [f"MODEL {model_dir}: not a directory"]
    problems: list[str] = []
    try:
        config = load_model_config(model_dir)
    except CheckpointError as error:
        return [f"MODEL {error}"]
    problems += [f"MODEL {model_dir / name}: missing (the served model's tokenizer)"
                 for name in TOKENIZER_FILES if not (model_dir / name).is_file()]
    try:
        weight_files(model_dir)
    except CheckpointError as error:
        problems.append(f"MODEL {error}")
    if (model_dir / ADAPTERS_DIR).exists():
        problems.append(f"MODEL {model_dir / ADAPTERS_DIR}: the adapters come from ADAPTERS, "
                        "not from the model directory (it would mix two sets under "
                        f"{ADAPTERS_DIR}/)")
    problems += check_model_config(config, settings, where=f"MODEL {model_dir / 'config.json'}")
    return problems


def check_model_config(config: Mapping[str, Any], settings: LlmEndpointSettings, *,
                       where: str) -> list[str]:
    """A checkpoint's config.json against the settings: the architecture the GPU budget planned
    (``llm.model.config``) and the quantization the endpoint expects (``llm.model.quantization``).
    ``where`` names the file in each problem. Also used by ``make promote`` on a candidate."""
    planned = json.loads((REPO_ROOT / settings.model.config).read_text(encoding="utf-8"))
    problems = [
        f"{where}: {key} is {config.get(key)!r}, but the GPU budget planned for "
        f"{planned[key]!r} (llm.model.config {settings.model.config})"
        for key in ARCHITECTURE_KEYS if key in planned and config.get(key) != planned[key]]
    return problems + _quantization_problems(where, config, settings.model.quantization)


def _quantization_problems(where: str, config: Mapping[str, Any], setting: str) -> list[str]:
    expected = parse_quantization(setting)
    try:
        declared = read_quantization_format(config)
    except (CheckpointError, KeyError, TypeError, ValueError) as error:
        return [f"{where}: unreadable quantization_config ({error})"]
    wanted = f"llm.model.quantization is {setting!r}"
    if expected.checkpoint_quant_method is None:
        if declared is not None:
            return [f"{where}: declares quant_method {declared.quant_method!r} "
                    f"({declared.bits}-bit) but {wanted} (unquantized weights)"]
        return []
    if declared is None:
        return [f"{where}: has no quantization_config (unquantized weights) but {wanted} "
                f"(quant_method {expected.checkpoint_quant_method!r})"]
    if declared.quant_method != expected.checkpoint_quant_method:
        return [f"{where}: quant_method is {declared.quant_method!r} but {wanted} "
                f"(quant_method {expected.checkpoint_quant_method!r})"]
    if declared.bits != expected.bits:
        return [f"{where}: {declared.bits}-bit weights but {wanted} ({expected.bits}-bit)"]
    if expected.group_size is not None and declared.group_size != expected.group_size:
        return [f"{where}: group_size {declared.group_size} but {wanted} "
                f"(group {expected.group_size})"]
    return []


# --- the adapters -----------------------------------------------------------------------------


def _model_name(value: str) -> str:
    """The model's own name in a Hugging Face id or a local path, for comparison."""
    return PurePosixPath(value.rstrip("/")).name.lower()


def check_adapters(adapters_dir: Path, settings: LlmEndpointSettings,
                   memory_plan: MemoryPlan) -> list[str]:
    """Problems with the configured adapters under ``adapters_dir`` (one folder each);
    ``memory_plan`` is the environment's GPU memory plan (made when its settings loaded)."""
    if not adapters_dir.is_dir():
        return [f"ADAPTERS {adapters_dir}: not a directory"]
    max_rank = memory_plan.max_lora_rank
    base = settings.model.base_model
    problems: list[str] = []
    for adapter in settings.adapters:
        folder = adapters_dir / adapter.folder
        config_path = folder / ADAPTER_CONFIG
        if not config_path.is_file():
            problems.append(f"ADAPTERS {config_path}: missing (adapter {adapter.name!r} of "
                            "llm.adapters)")
            continue
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            problems.append(f"ADAPTERS {config_path}: not valid JSON ({error})")
            continue
        rank = config.get("r") if isinstance(config, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            problems.append(f"ADAPTERS {config_path}: r is {rank!r}, not a LoRA rank")
        elif rank > max_rank:
            problems.append(
                f"ADAPTERS {config_path}: r {rank} exceeds the planned max_lora_rank {max_rank} "
                f"(the GPU budget sizes every LoRA slot for the largest llm.adapters[].rank; "
                f"{adapter.name!r} is configured with rank {adapter.rank})")
        named = config.get("base_model_name_or_path") if isinstance(config, dict) else None
        if not isinstance(named, str) or _model_name(named) != _model_name(base):
            problems.append(
                f"ADAPTERS {config_path}: base_model_name_or_path {named!r} does not name "
                f"llm.model.base_model {base!r}: an adapter trained on another model would load "
                "and answer nonsense")
        if not (folder / ADAPTER_WEIGHTS).is_file():
            problems.append(f"ADAPTERS {folder / ADAPTER_WEIGHTS}: missing (vLLM loads the "
                            "adapter's weights from it)")
    return problems


def unconfigured_adapters(adapters_dir: Path, settings: LlmEndpointSettings) -> list[str]:
    """Folders under ``adapters_dir`` that no configured adapter names (not uploaded)."""
    if not adapters_dir.is_dir():
        return []
    configured = {adapter.folder for adapter in settings.adapters}
    return sorted(p.name for p in adapters_dir.iterdir() if p.is_dir() and p.name not in configured)


# --- the intent archive -----------------------------------------------------------------------


def check_intent_archive(archive: Path, settings: IntentEndpointSettings) -> list[str]:
    """Problems with a compiled intent model.tar.gz, read the way the server will read it."""
    where = f"INTENT {archive}"
    if not archive.is_file():
        return [f"{where}: no such file (neuron/compile.py writes OUT/model.tar.gz)"]
    with tempfile.TemporaryDirectory(prefix="publish-intent-") as scratch:
        root = Path(scratch)
        try:
            safe_extract(archive, root)
        except (tarfile.TarError, OSError, ValueError) as error:
            return [f"{where}: not a readable model.tar.gz ({error})"]
        try:
            manifest = manifest_from_json(
                (root / NEURON_MANIFEST_FILE).read_text(encoding="utf-8"))
            check_labels(manifest, labels_from_json(
                (root / "labels.json").read_text(encoding="utf-8")), INTENT_LABELS)
        except FileNotFoundError as error:
            return [f"{where}: {Path(str(error.filename)).name} is missing from the archive"]
        except NeuronManifestError as error:
            return [f"{where}: {error}"]
        if manifest.target.value != settings.target:
            return [f"{where}: compiled for {manifest.target.value} (manifest.json target) but "
                    f"intent.target is {settings.target}: compile with python -m neuron.compile "
                    f"--target {settings.target}"]
        problem = manifest.servable_problem
        if problem:
            return [f"{where}: {problem}"]
        if not (root / MANIFEST_FILE).is_file():
            return [f"{where}: has no {MANIFEST_FILE}, which the container checks at start: "
                    "compile it again with this repository's python -m neuron.compile"]
        try:
            packed = artifact_files_from_json((root / MANIFEST_FILE).read_text("utf-8"),
                                              source=f"{archive.name}/{MANIFEST_FILE}")
        except ManifestError as error:
            return [f"{where}: {error}"]
        mismatch = find_mismatch(root, packed)
        if mismatch:
            return [f"{where}: {mismatch}"]
    return []


# --- what goes where --------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    """One file to publish: where it is, its path inside the artifact, its size and digest."""

    path: Path
    relative: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ArtifactUpload:
    """Everything one endpoint's artifact consists of, and the manifest describing it."""

    artifact: ModelArtifact
    files: tuple[LocalFile, ...]
    adapter_folders: Mapping[str, str] = field(default_factory=dict)
    """The LoRA adapters published with the model: served name -> folder under ``adapters/``
    (the manifest names each with its checksum; the LLM container serves no other)."""

    @property
    def manifest(self) -> ArtifactFiles:
        """The manifest: every file, the GPU start cache's (``start-cache/``, optional: the
        container refuses a differing one and starts without it) in its own entry."""
        every = {f.relative: FileDigest(f.size, f.sha256) for f in self.files}
        cache = {path: digest for path, digest in every.items()
                 if path.startswith(f"{START_CACHE_DIR}/")}
        files = ArtifactFiles(files={path: digest for path, digest in every.items()
                                     if path not in cache})
        named: dict[str, NamedAdapter] = {}
        for name, folder in self.adapter_folders.items():
            checksum = adapter_checksum_in(files, folder, ADAPTERS_DIR)
            if checksum is not None:
                named[name] = NamedAdapter(directory=folder, sha256=checksum)
        return ArtifactFiles(files=files.files, adapters=named, start_cache=cache)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


Hasher = Callable[[Path], str]


def _describe(pairs: Iterable[tuple[Path, str]], hasher: Hasher) -> tuple[LocalFile, ...]:
    return tuple(LocalFile(path, relative, path.stat().st_size, hasher(path))
                 for path, relative in pairs)


def llm_upload(model_dir: Path, adapters_dir: Path, settings: LlmEndpointSettings,
               layout: ArtifactLayout, *, hasher: Hasher = sha256_file) -> ArtifactUpload:
    """The LLM's files: the base model at the root, each adapter under its layout folder."""
    pairs = [(model_dir / name, name) for name in list_artifact_files(model_dir)]
    for adapter in settings.adapters:
        folder = adapters_dir / adapter.folder
        relative = layout.llm_adapter_dirs[adapter.name]
        pairs += [(folder / name, f"{relative}/{name}") for name in list_artifact_files(folder)]
    return ArtifactUpload(layout.llm, _describe(pairs, hasher),
                          {adapter.name: adapter.folder for adapter in settings.adapters})


def intent_upload(archive: Path, layout: ArtifactLayout, *,
                  hasher: Hasher = sha256_file) -> ArtifactUpload:
    """The intent artifact: the archive under its configured name."""
    return ArtifactUpload(layout.intent, _describe([(archive, layout.intent_archive_name)], hasher))


def stale_keys(upload: ArtifactUpload, existing_keys: Sequence[str]) -> list[str]:
    """Keys under the artifact's prefix that its manifest does not list (left from before).

    SageMaker copies everything under the LLM's prefix into the model directory, so a stray
    shard or an old adapter would sit next to the published files.
    """
    wanted = {upload.artifact.key(f.relative) for f in upload.files}
    wanted.add(upload.artifact.manifest_key)
    return sorted(key for key in existing_keys if key not in wanted)
