"""Every image `make deploy` publishes is one SageMaker CreateModel accepts: checked after
`cdk publish-assets`, against ECR (moto), before the Serving stack.

SageMaker refuses an OCI index (Docker's containerd image store, buildx provenance attestations)
and even a single OCI image manifest: "Unsupported manifest media type
application/vnd.oci.image.manifest.v1+json for image ... Ensure that valid manifest media type is
used for specified image" (aws/amazon-sagemaker-feedback#180,
https://github.com/aws/amazon-sagemaker-feedback/issues/180); its workaround, `--provenance=false`
with `--output type=docker`, is what the build uses: ``BUILDX_NO_DEFAULT_ATTESTATIONS=1`` ("Turn
off default provenance attestations", Docker's "Build variables",
https://docs.docker.com/build/building/variables/#buildx_no_default_attestations) and the image
assets' ``dockerOutputs``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from stacks.settings import load_settings
from tests.support.aws import fake_credentials
from tools.image_check import (
    DOCKER_V2_MANIFEST,
    ImageDestination,
    image_destinations,
    main,
    serving_assets_file,
)

PROD = load_settings("prod")
REPOSITORY = "cdk-hnb659fds-container-assets-123456789012-ap-northeast-1"


def manifest(media_type: str) -> str:
    if media_type.endswith("index.v1+json"):
        return json.dumps({"schemaVersion": 2, "mediaType": media_type, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 668,
             "digest": "sha256:" + "a" * 64,
             "platform": {"architecture": "amd64", "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 566,
             "digest": "sha256:" + "b" * 64,
             "annotations": {"vnd.docker.reference.type": "attestation-manifest"},
             "platform": {"architecture": "unknown", "os": "unknown"}}]})
    return json.dumps({"schemaVersion": 2, "mediaType": media_type,
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "size": 7023, "digest": "sha256:" + "c" * 64},
                       "layers": []})


@pytest.fixture
def ecr(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    fake_credentials(monkeypatch, PROD.region)
    with mock_aws():
        session = boto3.Session(region_name=PROD.region)
        session.client("ecr").create_repository(repositoryName=REPOSITORY)
        yield session


def destinations(synthesized: Any) -> list[ImageDestination]:
    path = serving_assets_file(synthesized.outdir, "Prod")
    return image_destinations(json.loads(path.read_text()))


def push(session: Any, destination: ImageDestination, media_type: str) -> None:
    session.client("ecr").put_image(repositoryName=destination.repository_name,
                                    imageTag=destination.image_tag,
                                    imageManifest=manifest(media_type),
                                    imageManifestMediaType=media_type)


def run(session: Any, synthesized: Any) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = main(["--env", "prod", "--assembly", str(synthesized.outdir)], session=session,
                out=out)
    return code, out.getvalue().strip().splitlines()


def test_the_serving_stack_publishes_three_images_built_with_docker_media_types(
    synthesized: Any,
) -> None:
    found = destinations(synthesized)
    assert [d.display_name for d in found] == [
        "IntentEndpoint/Image", "LlmEndpoint/Image", "QuantizationJob/Image"]
    assert {d.repository_name for d in found} == {REPOSITORY}
    assets = json.loads(serving_assets_file(synthesized.outdir, "Prod").read_text())
    for image in assets["dockerImages"].values():
        assert image["source"]["dockerOutputs"] == ["type=docker"], image["displayName"]


def test_docker_v2_manifests_pass(ecr: Any, synthesized: Any) -> None:
    for destination in destinations(synthesized):
        push(ecr, destination, DOCKER_V2_MANIFEST)
    code, lines = run(ecr, synthesized)
    assert code == 0, lines
    assert lines == [f"ok: {name}: {DOCKER_V2_MANIFEST}" for name in
                     ("IntentEndpoint/Image", "LlmEndpoint/Image", "QuantizationJob/Image")]


def test_an_attestation_index_or_an_oci_manifest_stops_the_deploy(ecr: Any,
                                                                  synthesized: Any) -> None:
    intent, llm, quantize = destinations(synthesized)
    push(ecr, intent, DOCKER_V2_MANIFEST)
    push(ecr, llm, "application/vnd.oci.image.index.v1+json")
    push(ecr, quantize, "application/vnd.oci.image.manifest.v1+json")
    code, lines = run(ecr, synthesized)
    assert code == 1
    problems = [line for line in lines if line.startswith("image check: ")]
    assert problems == [
        f"image check: LlmEndpoint/Image: {llm.reference} was pushed as "
        "application/vnd.oci.image.index.v1+json (an OCI image index (build attestations or "
        "several platforms)), which SageMaker CreateModel refuses ('Unsupported manifest media "
        f"type'); it takes {DOCKER_V2_MANIFEST}. Delete the tag (aws ecr batch-delete-image "
        f"--repository-name {REPOSITORY} --image-ids imageTag={llm.image_tag} --region "
        "ap-northeast-1) and publish again with make deploy, which builds with "
        "BUILDX_NO_DEFAULT_ATTESTATIONS=1 and --output type=docker",
        f"image check: QuantizationJob/Image: {quantize.reference} was pushed as "
        "application/vnd.oci.image.manifest.v1+json (an OCI image manifest), which SageMaker "
        "CreateModel refuses ('Unsupported manifest media type'); it takes "
        f"{DOCKER_V2_MANIFEST}. Delete the tag (aws ecr batch-delete-image --repository-name "
        f"{REPOSITORY} --image-ids imageTag={quantize.image_tag} --region ap-northeast-1) and "
        "publish again with make deploy, which builds with BUILDX_NO_DEFAULT_ATTESTATIONS=1 and "
        "--output type=docker",
    ]


def test_an_image_that_was_not_pushed_is_named(ecr: Any, synthesized: Any) -> None:
    code, lines = run(ecr, synthesized)
    assert code == 1
    assert lines[0].startswith("image check: IntentEndpoint/Image: ")
    assert lines[0].endswith("is not in ECR: cdk publish-assets did not push it (see its output "
                             "above)")
