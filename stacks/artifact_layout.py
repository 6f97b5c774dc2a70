"""Where each endpoint's model artifacts live in the artifact bucket: one function, every user.

:func:`artifact_layout` turns the validated settings into the S3 keys. The stacks point the
SageMaker models and the execution roles at them, ``make publish`` uploads to them,
``make preflight`` checks them, and the key tables of docs/operate.md and docs/intent.md are its
output (``python -m tools.publish --env <env> --show-layout``): nothing else spells a key.

    <llm.model.artifact_prefix>/                 the LLM's model data (S3Prefix, uncompressed)
        config.json, tokenizer*, *.safetensors   the base model at the root
        adapters/<adapter directory>/            one folder per LoRA adapter
        artifact-manifest.json                   size + SHA-256 of every file above
    <folder of intent.artifact_key>/
        model.tar.gz                             the compiled classifier (SageMaker unpacks it)
        artifact-manifest.json                   size + SHA-256 of model.tar.gz

Pure module: settings in, strings out; no AWS or CDK imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from artifact_manifest import MANIFEST_FILE
from stacks.settings import EnvironmentSettings

ADAPTERS_DIR = "adapters"
"""Folder of the LoRA adapters inside the LLM's model data (and so inside /opt/ml/model)."""


@dataclass(frozen=True)
class ModelArtifact:
    """One endpoint's model data in the artifact bucket."""

    endpoint: str
    model_data_key: str
    """What the SageMaker model reads: a prefix ending in ``/`` or a ``.tar.gz`` key."""
    read_prefix: str
    """The key prefix (no trailing ``/``) under which the execution role may read."""
    manifest_key: str
    """artifact-manifest.json of this artifact."""

    @property
    def is_prefix(self) -> bool:
        """True when the model data is an uncompressed S3 prefix."""
        return self.model_data_key.endswith("/")

    def key(self, relative_path: str) -> str:
        """The S3 key of a file of this artifact, given its path relative to the artifact."""
        return f"{self.read_prefix}/{relative_path}"


@dataclass(frozen=True)
class ArtifactLayout:
    """Every key an environment's endpoints read."""

    bucket: str
    llm: ModelArtifact
    llm_adapter_dirs: Mapping[str, str]
    """Adapter name -> its folder relative to the LLM's model data (``adapters/<directory>``)."""
    intent: ModelArtifact

    @property
    def intent_archive_name(self) -> str:
        """File name of the intent archive (its path relative to the intent artifact)."""
        return self.intent.model_data_key.rsplit("/", 1)[1]

    def artifacts(self) -> tuple[ModelArtifact, ...]:
        """Both endpoints' artifacts."""
        return (self.llm, self.intent)

    def describe(self) -> str:
        """The layout as docs/operate.md shows it: one key per line."""
        root = f"s3://{self.bucket}"
        lines = [
            f"LLM model data     {root}/{self.llm.model_data_key}",
            *(f"  adapter {name:<10} {root}/{self.llm.key(folder)}/"
              for name, folder in self.llm_adapter_dirs.items()),
            f"  manifest         {root}/{self.llm.manifest_key}",
            f"intent archive     {root}/{self.intent.model_data_key}",
            f"  manifest         {root}/{self.intent.manifest_key}",
        ]
        return "\n".join(lines)


def artifact_layout(settings: EnvironmentSettings) -> ArtifactLayout:
    """The artifact keys of one environment, from its validated settings."""
    llm_prefix = settings.llm.model.artifact_prefix
    intent_folder = settings.intent.artifact_folder
    return ArtifactLayout(
        bucket=settings.artifact_bucket_name,
        llm=ModelArtifact(
            endpoint="llm",
            model_data_key=f"{llm_prefix}/",
            read_prefix=llm_prefix,
            manifest_key=f"{llm_prefix}/{MANIFEST_FILE}",
        ),
        llm_adapter_dirs={
            adapter.name: f"{ADAPTERS_DIR}/{adapter.folder}" for adapter in settings.llm.adapters
        },
        intent=ModelArtifact(
            endpoint="intent",
            model_data_key=settings.intent.artifact_key,
            read_prefix=intent_folder,
            manifest_key=f"{intent_folder}/{MANIFEST_FILE}",
        ),
    )
