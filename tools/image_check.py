#!/usr/bin/env python3
"""`make deploy`'s check of the images it published: is each one a manifest SageMaker accepts?

    python -m tools.image_check --env prod [--assembly cdk.out]

SageMaker ``CreateModel`` refuses an image whose manifest is an OCI image index (Docker's
containerd image store and buildx push one with provenance attestations by default) and even a
single OCI image manifest: "Unsupported manifest media type
application/vnd.oci.image.manifest.v1+json for image ... Ensure that valid manifest media type is
used for specified image"
(aws/amazon-sagemaker-feedback#180, https://github.com/aws/amazon-sagemaker-feedback/issues/180).
It takes a Docker image manifest, version 2, schema 2. CloudFormation would find out only when it
creates the SageMaker model, after the images were pushed and the stack update began, and roll
back.

So ``make deploy`` builds without attestations and with Docker's media types
(``BUILDX_NO_DEFAULT_ATTESTATIONS=1``, Docker's "Build variables"; the image assets' ``--output
type=docker``, stacks/container_image.py), publishes the Serving stack's assets first
(``cdk publish-assets``), and runs this: for every image asset of the stage's Serving stack
(the cloud assembly's ``*.assets.json``) it reads the pushed manifest's media type from ECR
(``DescribeImages``) and stops the deploy, one line per image, when it is anything else.

Exit status: 0 every image is accepted, 1 an image is not (or is missing), 2 the check could not
run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

DOCKER_V2_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
"""The one manifest media type SageMaker CreateModel takes (Docker image manifest v2, schema 2)."""

WHAT_IT_IS = {
    "application/vnd.oci.image.index.v1+json": "an OCI image index (build attestations or "
                                               "several platforms)",
    "application/vnd.docker.distribution.manifest.list.v2+json": "a Docker manifest list "
                                                                  "(several platforms)",
    "application/vnd.oci.image.manifest.v1+json": "an OCI image manifest",
}


class ImageCheckError(RuntimeError):
    """The check could not run (no assembly, no such stage)."""


@dataclass(frozen=True)
class ImageDestination:
    """One image asset of the Serving stack as cdk publish-assets pushes it."""

    display_name: str
    repository_name: str
    image_tag: str
    region: str

    @property
    def reference(self) -> str:
        """``repository:tag``."""
        return f"{self.repository_name}:{self.image_tag}"


def serving_assets_file(assembly: Path, stage_name: str) -> Path:
    """The Serving stack's asset manifest in the stage's nested cloud assembly."""
    root = assembly / "manifest.json"
    if not root.is_file():
        raise ImageCheckError(f"no cloud assembly at {assembly}: run make synth")
    artifacts = json.loads(root.read_text(encoding="utf-8")).get("artifacts", {})
    stages = [a for a in artifacts.values() if a.get("type") == "cdk:cloud-assembly"
              and a.get("properties", {}).get("displayName") == stage_name]
    if not stages:
        raise ImageCheckError(f"{assembly} has no stage {stage_name}: run make synth")
    directory = assembly / stages[0]["properties"]["directoryName"]
    stage = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))["artifacts"]
    for artifact in stage.values():
        if artifact.get("displayName") != f"{stage_name}/Serving":
            continue
        for dependency in artifact.get("dependencies", []):
            if stage.get(dependency, {}).get("type") == "cdk:asset-manifest":
                return directory / str(stage[dependency]["properties"]["file"])
    raise ImageCheckError(f"{directory}: no asset manifest of {stage_name}/Serving")


def image_destinations(assets: Mapping[str, Any]) -> list[ImageDestination]:
    """Every image destination of an asset manifest (``*.assets.json``)."""
    found = []
    for image in assets.get("dockerImages", {}).values():
        for destination in image.get("destinations", {}).values():
            found.append(ImageDestination(
                display_name=str(image.get("displayName") or image["source"].get("dockerFile")),
                repository_name=str(destination["repositoryName"]),
                image_tag=str(destination["imageTag"]), region=str(destination["region"])))
    return sorted(found, key=lambda d: d.display_name)


def manifest_problem(destination: ImageDestination, media_type: str | None) -> str | None:
    """One line when the pushed image is not one SageMaker CreateModel takes."""
    if media_type == DOCKER_V2_MANIFEST:
        return None
    delete = (f"aws ecr batch-delete-image --repository-name {destination.repository_name} "
              f"--image-ids imageTag={destination.image_tag} --region {destination.region}")
    if media_type is None:
        return (f"{destination.display_name}: {destination.reference} is not in ECR: cdk "
                "publish-assets did not push it (see its output above)")
    what = WHAT_IT_IS.get(media_type, "not a Docker v2 image manifest")
    return (f"{destination.display_name}: {destination.reference} was pushed as {media_type} "
            f"({what}), which SageMaker CreateModel refuses ('Unsupported manifest media type'); "
            f"it takes {DOCKER_V2_MANIFEST}. Delete the tag ({delete}) and publish again with "
            "make deploy, which builds with BUILDX_NO_DEFAULT_ATTESTATIONS=1 and --output "
            "type=docker")


def pushed_media_type(ecr: Any, destination: ImageDestination) -> str | None:
    """The manifest media type ECR holds for the tag (None: no such image)."""
    from botocore.exceptions import ClientError

    try:
        described = ecr.describe_images(repositoryName=destination.repository_name,
                                        imageIds=[{"imageTag": destination.image_tag}])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("ImageNotFoundException",
                                                           "RepositoryNotFoundException"):
            return None
        raise
    details = described.get("imageDetails", [])
    return str(details[0].get("imageManifestMediaType")) if details else None


def check_images(destinations: Sequence[ImageDestination], session: Any,
                 out: TextIO) -> list[str]:
    """Problems, one line each; prints what passed."""
    problems: list[str] = []
    clients: dict[str, Any] = {}
    for destination in destinations:
        ecr = clients.setdefault(destination.region,
                                 session.client("ecr", region_name=destination.region))
        problem = manifest_problem(destination, pushed_media_type(ecr, destination))
        if problem:
            problems.append(problem)
        else:
            print(f"ok: {destination.display_name}: {DOCKER_V2_MANIFEST}", file=out)
    return problems


def main(argv: Sequence[str] | None = None, *, session: Any = None,
         out: TextIO = sys.stderr) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.image_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="environment: config/<env>.yaml")
    parser.add_argument("--assembly", type=Path, default=Path("cdk.out"),
                        help="the synthesized cloud assembly (default cdk.out)")
    args = parser.parse_args(argv)
    from botocore.exceptions import BotoCoreError, ClientError

    from stacks.settings import CONFIG_DIR, SettingsError, load_settings
    from tools.aws_context import aws_session

    try:
        settings = load_settings(args.env, config_dir=Path(
            os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR)))
        assets = json.loads(serving_assets_file(args.assembly, settings.stage_name).read_text(
            encoding="utf-8"))
        problems = check_images(image_destinations(assets), session or aws_session(settings),
                                out)
    except (SettingsError, ImageCheckError) as error:
        print(f"image check: {error}", file=out)
        return 2
    except (BotoCoreError, ClientError) as error:
        print(f"image check: AWS refused a read: {error}", file=out)
        return 2
    for problem in problems:
        print(f"image check: {problem}", file=out)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
