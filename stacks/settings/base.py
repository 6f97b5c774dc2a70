"""What every settings model shares: the strict base model, the repository's paths and the
constrained string types several areas use (account ids, S3 prefixes, adapter names ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

from serving_contract import ADAPTER_NAME_PATTERN, DIRECTORY_PATTERN, LOCALE_PATTERN

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "config"

AccountId = Annotated[str, StringConstraints(pattern=r"^\d{12}$")]
EnvironmentName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{1,15}$")]
Email = Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")]
TagValue = Annotated[str, StringConstraints(min_length=1, max_length=256)]
S3Prefix = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9!_.*'()/-]*[^/]$")]
LocalTime = Annotated[str, StringConstraints(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]

# What the stack writes into the LLM container and the gateway parses: one contract for both.
AdapterName = Annotated[str, StringConstraints(pattern=ADAPTER_NAME_PATTERN.pattern)]
FolderName = Annotated[str, StringConstraints(pattern=DIRECTORY_PATTERN.pattern)]
LocaleTag = Annotated[str, StringConstraints(pattern=LOCALE_PATTERN.pattern)]
RepoRelativePath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./-]+$")]

ArchiveKey = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9!_.*'()/-]*\.tar\.gz$")
]
GitHubRepository = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
]
RoleArn = Annotated[
    str, StringConstraints(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/[A-Za-z0-9+=,.@_-]{1,64}$")
]


class StrictModel(BaseModel):
    """Base for every settings model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)
