"""`make publish` against moto (S3, KMS, CloudFormation, STS): checks first, then the keys the
settings define, SSE-KMS with the project key, parallel parts, resumable, manifest last."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from artifact_manifest import artifact_files_from_json
from stacks.artifact_layout import artifact_layout
from stacks.settings import REPO_ROOT, load_settings
from tests.support.artifacts import (
    W4A16_CONFIG,
    write_adapters,
    write_intent_archive,
    write_model_dir,
)
from tests.support.aws import aws_environment, fake_credentials
from tools.publish.__main__ import main
from tools.publish.upload import SHA256_METADATA

DEV = load_settings("dev")
LAYOUT = artifact_layout(DEV)


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_credentials(monkeypatch, DEV.region)


@pytest.fixture
def artifacts(tmp_path: Path) -> dict[str, Path]:
    return {
        # 12 MiB of weights: three 5 MiB parts with --part-size-mib 5
        "model": write_model_dir(tmp_path / "model", weights_bytes=12 * 1024 * 1024),
        "adapters": write_adapters(tmp_path / "lora"),
        "intent": write_intent_archive(tmp_path / "intent"),
    }


def publish(artifacts: dict[str, Path], session: Any = None, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["--env", "dev", "--model", str(artifacts["model"]),
                 "--adapters", str(artifacts["adapters"]), "--intent", str(artifacts["intent"]),
                 "--part-size-mib", "5", "--threads", "3", *extra], session=session, out=out)
    return code, out.getvalue()


def expected_keys() -> set[str]:
    llm = {LAYOUT.llm.key(name) for name in (
        "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
        "model.safetensors")}
    for folder in LAYOUT.llm_adapter_dirs.values():
        llm |= {LAYOUT.llm.key(f"{folder}/adapter_config.json"),
                LAYOUT.llm.key(f"{folder}/adapter_model.safetensors")}
    return llm | {LAYOUT.llm.manifest_key, LAYOUT.intent.model_data_key,
                  LAYOUT.intent.manifest_key}


def keys(s3: Any, bucket: str) -> set[str]:
    return {item["Key"] for item in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}


def versions(s3: Any, bucket: str, key: str) -> int:
    return len(s3.list_object_versions(Bucket=bucket, Prefix=key)["Versions"])


def test_uploads_exactly_the_layout_keys_encrypted_with_the_project_key(
        artifacts: dict[str, Path]) -> None:
    with aws_environment(DEV) as aws:
        code, output = publish(artifacts, aws.session)
        assert code == 0, output
        s3 = aws.session.client("s3")
        assert keys(s3, aws.bucket) == expected_keys()
        assert LAYOUT.llm.key("adapters/manga_domain/adapter_config.json") == (
            "models/llama-3-8b-instruct-awq/adapters/manga_domain/adapter_config.json")
        assert LAYOUT.intent.model_data_key == (
            "models/intent/distilbert-manga-intent-inf1/model.tar.gz")
        manifest = artifact_files_from_json(s3.get_object(
            Bucket=aws.bucket, Key=LAYOUT.llm.manifest_key)["Body"].read().decode())
        for key in expected_keys():
            head = s3.head_object(Bucket=aws.bucket, Key=key)
            assert head["ServerSideEncryption"] == "aws:kms", key
            assert head["SSEKMSKeyId"] == aws.key_arn, key
            assert re.fullmatch(r"[0-9a-f]{64}", head["Metadata"][SHA256_METADATA]), key
        weights = s3.head_object(Bucket=aws.bucket, Key=LAYOUT.llm.key("model.safetensors"))
        assert weights["ETag"].strip('"').endswith("-3"), "12 MiB in 5 MiB parts: multipart"
        assert manifest.files["model.safetensors"].size == 12 * 1024 * 1024
        assert manifest.files["model.safetensors"].sha256 == weights["Metadata"]["sha256"]
        assert len(manifest.files) == 11  # 5 base-model files + 3 adapters x 2
        intent = json.loads(s3.get_object(Bucket=aws.bucket, Key=LAYOUT.intent.manifest_key)[
            "Body"].read())
        assert list(intent["files"]) == ["model.tar.gz"]
    assert "[9/11] uploading model.safetensors (12.0 MiB)" in output
    assert re.search(r"model\.safetensors: \d+ % of 12\.0 MiB", output), output
    assert "llm: 11 uploaded, 0 unchanged" in output
    assert "intent: 1 uploaded, 0 unchanged" in output


def test_a_rerun_skips_what_is_already_there(artifacts: dict[str, Path]) -> None:
    with aws_environment(DEV) as aws:
        assert publish(artifacts, aws.session)[0] == 0
        code, output = publish(artifacts, aws.session)
        assert code == 0, output
        s3 = aws.session.client("s3")
        assert versions(s3, aws.bucket, LAYOUT.llm.key("model.safetensors")) == 1
        assert versions(s3, aws.bucket, LAYOUT.intent.model_data_key) == 1
    assert "llm: 0 uploaded, 11 unchanged" in output
    assert "intent: 0 uploaded, 1 unchanged" in output
    assert "[9/11] unchanged model.safetensors (same SHA-256)" in output


class InterruptedS3:
    """An S3 client whose connection drops at the n-th file upload."""

    def __init__(self, client: Any, fail_at: int) -> None:
        self.client, self.fail_at, self.calls = client, fail_at, 0

    def upload_file(self, *args: Any, **kwargs: Any) -> None:
        from botocore.exceptions import EndpointConnectionError

        self.calls += 1
        if self.calls == self.fail_at:
            raise EndpointConnectionError(endpoint_url="https://s3.ap-northeast-1.amazonaws.com")
        self.client.upload_file(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class SessionWith:
    def __init__(self, session: Any, s3: Any) -> None:
        self.session, self.s3 = session, s3

    def client(self, name: str) -> Any:
        return self.s3 if name == "s3" else self.session.client(name)


def test_an_interrupted_run_is_finished_by_the_next(artifacts: dict[str, Path]) -> None:
    with aws_environment(DEV) as aws:
        flaky = InterruptedS3(aws.session.client("s3"), fail_at=4)
        code, output = publish(artifacts, SessionWith(aws.session, flaky))
        assert code == 1
        assert "re-run to finish" in output
        s3 = aws.session.client("s3")
        assert LAYOUT.llm.manifest_key not in keys(s3, aws.bucket), "the manifest goes last"
        code, output = publish(artifacts, aws.session)
        assert code == 0, output
        assert keys(s3, aws.bucket) == expected_keys()
    assert "llm: 8 uploaded, 3 unchanged" in output


def test_a_changed_file_is_uploaded_again(artifacts: dict[str, Path]) -> None:
    with aws_environment(DEV) as aws:
        assert publish(artifacts, aws.session)[0] == 0
        (artifacts["model"] / "generation_config.json").write_text('{"eos_token_id": 1}')
        code, output = publish(artifacts, aws.session)
        assert code == 0, output
        s3 = aws.session.client("s3")
        assert versions(s3, aws.bucket, LAYOUT.llm.key("generation_config.json")) == 2
    assert "llm: 1 uploaded, 10 unchanged" in output


def test_objects_the_manifest_does_not_list_are_reported(artifacts: dict[str, Path]) -> None:
    with aws_environment(DEV) as aws:
        stray = LAYOUT.llm.key("model-00002-of-00002.safetensors")
        aws.session.client("s3").put_object(Bucket=aws.bucket, Key=stray, Body=b"old")
        code, output = publish(artifacts, aws.session)
    assert code == 0
    assert (f"warning: s3://{aws.bucket}/{stray} is not in the manifest; SageMaker would copy "
            f"it too: aws s3 rm s3://{aws.bucket}/{stray}") in output


def test_without_the_foundation_stack_it_says_what_to_deploy(artifacts: dict[str, Path]) -> None:
    with aws_environment(DEV, foundation=False) as aws:
        code, output = publish(artifacts, aws.session)
    assert code == 1
    assert output.strip().splitlines()[-1] == (
        "publish: stack Dev-Foundation does not exist in ap-northeast-1: deploy the Foundation "
        "stack first (make deploy ENV=dev does, then stops at the preflight until the artifacts "
        "are published)")


# --- refusals: one line each, nothing uploaded (no AWS session is even created) ----------------


def refused(artifacts: dict[str, Path]) -> list[str]:
    code, output = publish(artifacts, None)
    assert code == 2, output
    lines = output.strip().splitlines()
    assert all(line.startswith("publish: refused: ") for line in lines), output
    return lines


def test_an_adapter_rank_above_the_plan_is_refused(artifacts: dict[str, Path]) -> None:
    write_adapters(artifacts["adapters"], {"general_support": 128})
    config = artifacts["adapters"] / "general_support" / "adapter_config.json"
    assert refused(artifacts) == [
        f"publish: refused: ADAPTERS {config}: r 128 exceeds the planned max_lora_rank 64 (the "
        "GPU budget sizes every LoRA slot for the largest llm.adapters[].rank; 'support' is "
        "configured with rank 64)"]


def test_an_archive_compiled_for_another_target_is_refused(artifacts: dict[str, Path],
                                                          tmp_path: Path) -> None:
    artifacts["intent"] = write_intent_archive(tmp_path / "inf2", target="inf2")
    assert refused(artifacts) == [
        f"publish: refused: INTENT {artifacts['intent']}: compiled for inf2 (manifest.json "
        "target) but intent.target is inf1: compile with python -m neuron.compile --target inf1"]


def test_an_adapter_of_another_base_model_is_refused(artifacts: dict[str, Path]) -> None:
    write_adapters(artifacts["adapters"], {"jp_translation": 32},
                   base_model="meta-llama/Llama-2-7b-hf")
    (line,) = refused(artifacts)
    assert "jp_translation/adapter_config.json: base_model_name_or_path 'meta-llama/Llama-2-7b-hf'"\
           " does not name llm.model.base_model 'meta-llama/Meta-Llama-3-8B-Instruct'" in line


def test_a_local_path_naming_the_same_model_is_accepted(artifacts: dict[str, Path]) -> None:
    write_adapters(artifacts["adapters"], {"jp_translation": 32},
                   base_model="/data/models/Meta-Llama-3-8B-Instruct/")
    assert main(["--env", "dev", "--model", str(artifacts["model"]), "--adapters",
                 str(artifacts["adapters"]), "--dry-run"], out=io.StringIO()) == 0


@pytest.mark.parametrize(("quantization", "fragment"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
     "quant_method is 'awq' but llm.model.quantization is 'w4a16' "
     "(quant_method 'compressed-tensors')"),
    (None, "has no quantization_config (unquantized weights) but llm.model.quantization is "
           "'w4a16'"),
    ({**W4A16_CONFIG, "config_groups": {"group_0": {"weights": {"num_bits": 4,
                                                                "group_size": 64}}}},
     "group_size 64 but llm.model.quantization is 'w4a16' (group 128)"),
])
def test_a_checkpoint_in_another_quantization_is_refused(
        artifacts: dict[str, Path], tmp_path: Path, quantization: Any, fragment: str) -> None:
    artifacts["model"] = write_model_dir(tmp_path / "other", quantization=quantization)
    (line,) = refused(artifacts)
    assert fragment in line


def test_a_model_directory_without_tokenizer_or_weights_is_refused(
        artifacts: dict[str, Path]) -> None:
    (artifacts["model"] / "tokenizer.json").unlink()
    (artifacts["model"] / "model.safetensors").unlink()
    lines = refused(artifacts)
    assert len(lines) == 2
    assert lines[0].endswith("tokenizer.json: missing (the served model's tokenizer)")
    assert "no *.safetensors weights" in lines[1]


def test_a_model_of_another_architecture_is_refused(artifacts: dict[str, Path],
                                                    tmp_path: Path) -> None:
    artifacts["model"] = write_model_dir(tmp_path / "big", config_changes={
        "num_hidden_layers": 80})
    (line,) = refused(artifacts)
    assert "num_hidden_layers is 80, but the GPU budget planned for 32" in line


def test_a_corrupt_file_inside_the_archive_is_refused(artifacts: dict[str, Path],
                                                      tmp_path: Path) -> None:
    import tarfile

    source = artifacts["intent"]
    broken = tmp_path / "broken" / "model.tar.gz"
    broken.parent.mkdir()
    with tarfile.open(source) as original, tarfile.open(broken, "w:gz") as copy:
        for member in original.getmembers():
            data = original.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == "model-b1.pt":
                data = data[:-1] + b"!"
            member.size = len(data)
            copy.addfile(member, io.BytesIO(data))
    artifacts["intent"] = broken
    (line,) = refused(artifacts)
    assert "model-b1.pt: SHA-256" in line


def test_model_without_adapters_is_refused_as_an_argument(artifacts: dict[str, Path]) -> None:
    code = main(["--env", "dev", "--model", str(artifacts["model"])], out=(out := io.StringIO()))
    assert code == 2
    assert "--model and --adapters go together" in out.getvalue()


def test_show_layout_prints_the_keys_the_stacks_use() -> None:
    result = subprocess.run([sys.executable, "-m", "tools.publish", "--env", "prod",
                             "--show-layout"], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True, timeout=60)
    prod = artifact_layout(load_settings("prod"))
    assert result.stdout.strip() == prod.describe()
    assert f"s3://{prod.bucket}/models/llama-3-8b-instruct-awq/adapters/manga_domain/" in (
        result.stdout)
    assert (f"s3://{prod.bucket}/models/intent/distilbert-manga-intent-inf1/model.tar.gz"
            in result.stdout)


def test_the_start_cache_gets_its_own_optional_manifest_entry() -> None:
    from tools.publish.checks import ArtifactUpload, LocalFile

    files = tuple(LocalFile(Path(name), name, 1, "a" * 64) for name in
                  ("config.json", "start-cache/start-cache.json", "start-cache/start-cache.tar.gz"))
    manifest = ArtifactUpload(artifact=None, files=files).manifest  # type: ignore[arg-type]
    assert list(manifest.files) == ["config.json"]
    assert sorted(manifest.start_cache) == ["start-cache/start-cache.json",
                                            "start-cache/start-cache.tar.gz"]
    assert artifact_files_from_json(manifest.to_json()) == manifest
