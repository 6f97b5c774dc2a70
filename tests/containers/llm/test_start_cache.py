"""The GPU start cache (issue 38): the pure verdict, pack -> verify on this CPU host, every
refusal (tampered, foreign GPU, other vLLM, other engine arguments, a path out of the cache, a
model manifest that does not name it), and a real gateway start on the simulated engine, whose
stand-in compile cache lives in VLLM_CACHE_ROOT as vLLM's does."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from artifact_manifest import (
    MANIFEST_FILE,
    ArtifactFiles,
    describe_files,
    list_artifact_files,
    sha256_file,
)
from gateway.settings import Settings, SettingsError, load_settings
from gateway.start_cache.cli import build, pack
from gateway.start_cache.fingerprint import (
    MANIFEST_NAME,
    TARBALL_NAME,
    EngineFingerprint,
    HostFacts,
    Member,
    StartCacheManifest,
    check,
    engine_fingerprint,
    manifest_from_json,
    member_problem,
)
from gateway.start_cache.loader import (
    TRITON_CACHE_DIR,
    VLLM_CACHE_ROOT,
    host_facts,
    prepare_start_cache,
    verify,
)
from serving_contract.environment import GATEWAY_START_CACHE
from tests.containers.llm.harness import SERVE, GatewayProcess

HOST = HostFacts(gpu_name="NVIDIA A10G", compute_capability="8.6", vllm_version="0.33.0",
                 torch_version="2.11.0", triton_version="3.6.0", cuda_version="13.0",
                 python_version="3.12")
ARGS = {"dtype": "auto", "quantization": "compressed-tensors", "kv_cache_dtype": "auto",
        "max_num_batched_tokens": 8192, "max_num_seqs": 88, "max_model_len": 4096,
        "enforce_eager": False, "enable_lora": True, "max_lora_rank": 64, "max_loras": 4,
        "block_size": 16, "tensor_parallel_size": 1}
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_hidden_layers": 32, "quantization_config": {"quant_method": "compressed-tensors"}}
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 8192}


def manifest_for(host: HostFacts = HOST, args: dict[str, Any] | None = None) -> StartCacheManifest:
    return StartCacheManifest(host=host, engine=engine_fingerprint(args or ARGS, MODEL),
                              tarball_sha256="0" * 64, tarball_bytes=10,
                              contents=("triton", "vllm"), created_at="2026-01-01T00:00:00+00:00")


# --- the pure verdict ---------------------------------------------------------------------------


def test_the_same_host_and_engine_is_accepted() -> None:
    verdict = check(manifest_for(), HOST, engine_fingerprint(ARGS, MODEL))
    assert verdict.accepted and verdict.describe() == "accepted"


@pytest.mark.parametrize(("field", "value", "kind"), [
    ("gpu_name", "NVIDIA L4", "foreign"),
    ("compute_capability", "8.9", "foreign"),
    ("vllm_version", "0.34.0", "stale"),
    ("torch_version", "2.12.0", "stale"),
    ("triton_version", "3.7.0", "stale"),
    ("cuda_version", "12.8", "stale"),
    ("python_version", "3.11", "stale"),
])
def test_another_host_is_refused_naming_the_field_and_both_values(field: str, value: str,
                                                                   kind: str) -> None:
    verdict = check(manifest_for(), replace(HOST, **{field: value}),
                    engine_fingerprint(ARGS, MODEL))
    assert not verdict.accepted and verdict.field == field
    assert repr(getattr(HOST, field)) in verdict.reason and repr(value) in verdict.reason
    assert kind in verdict.reason


@pytest.mark.parametrize(("name", "value"), [
    ("max_num_seqs", 32), ("max_num_batched_tokens", 2048), ("enforce_eager", True),
    ("kv_cache_dtype", "fp8"), ("max_lora_rank", 8), ("block_size", 32), ("dtype", "float16"),
])
def test_other_engine_arguments_are_refused_naming_the_argument(name: str, value: Any) -> None:
    verdict = check(manifest_for(), HOST, engine_fingerprint({**ARGS, name: value}, MODEL))
    assert not verdict.accepted and verdict.field == f"engine.{name}"
    assert f"built for {ARGS[name]!r}" in verdict.reason and f"runs {value!r}" in verdict.reason


def test_another_model_architecture_is_refused() -> None:
    verdict = check(manifest_for(), HOST,
                    engine_fingerprint(ARGS, {**MODEL, "hidden_size": 2048}))
    assert verdict.field == "engine.model.hidden_size"


def test_a_bare_digest_is_compared_too_and_other_versions_of_the_format_refused() -> None:
    assert check(manifest_for(), HOST, engine_fingerprint(ARGS, MODEL).digest).accepted
    assert check(manifest_for(), HOST, "f" * 64).field == "engine_fingerprint"
    assert check(replace(manifest_for(), format_version=2), HOST,
                 engine_fingerprint(ARGS, MODEL)).field == "format_version"


def test_the_fingerprint_ignores_what_changes_no_kernel() -> None:
    base = engine_fingerprint(ARGS, MODEL)
    other = engine_fingerprint({**ARGS, "gpu_memory_utilization": 0.5, "load_format": "dummy",
                                "model": "/elsewhere"}, {**MODEL, "_name_or_path": "x"})
    assert base.digest == other.digest


def test_the_manifest_round_trips_through_json() -> None:
    manifest = manifest_for()
    assert manifest_from_json(manifest.to_json()) == replace(
        manifest, engine=EngineFingerprint(manifest.engine.digest, dict(manifest.engine.inputs)))


@pytest.mark.parametrize(("member", "accepted"), [
    (Member("triton/abc/kernel.cubin", "file"), True),
    (Member("vllm/torch_compile_cache/x", "dir"), True),
    (Member("triton/a/link", "symlink", "../b/kernel"), True),
    (Member("/etc/passwd", "file"), False),
    (Member("triton/../../etc/cron", "file"), False),
    (Member("other/file", "file"), False),
    (Member("triton/link", "symlink", "/etc/shadow"), False),
    (Member("triton/link", "symlink", "../../outside"), False),
    (Member("triton/hard", "hardlink", "../x"), False),
    (Member("triton/fifo", "other"), False),
])
def test_tar_members_stay_inside_the_cache(member: Member, accepted: bool) -> None:
    assert (member_problem(member) is None) == accepted


# --- pack -> verify on this host ----------------------------------------------------------------


@pytest.fixture
def model_dir(demo_model_dir: Path, tmp_path: Path) -> Path:
    """The demo model with a tiny Llama config.json (the engine fingerprint reads it)."""
    target = tmp_path / "model"
    shutil.copytree(demo_model_dir, target)
    (target / "config.json").write_text(json.dumps(LLAMA_CONFIG), encoding="utf-8")
    return target


def settings_for(model_dir: Path, **env: str) -> Settings:
    return load_settings({"GATEWAY_MODEL_DIR": str(model_dir), **env})


def packed(model_dir: Path, out: Path, **env: str) -> StartCacheManifest:
    caches = out.parent / f"{out.name}-caches"
    (caches / "triton" / "k1").mkdir(parents=True)
    (caches / "triton" / "k1" / "kernel.json").write_text("{}", encoding="utf-8")
    (caches / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (caches / "vllm" / "torch_compile_cache" / "graph.py").write_text("# g", encoding="utf-8")
    return pack(caches / "triton", caches / "vllm", model_dir, out,
                {"GATEWAY_MODEL_DIR": str(model_dir), **env})


def test_pack_then_verify_accepts_on_this_host_and_uses_it(model_dir: Path,
                                                           tmp_path: Path) -> None:
    out = model_dir / "start-cache"
    manifest = packed(model_dir, out)
    assert manifest.contents == ("triton", "vllm") and manifest.host == host_facts()
    assert verify(out, settings_for(model_dir))[1].accepted
    environ: dict[str, str] = {}
    lines: list[tuple[str, dict[str, Any]]] = []
    outcome = prepare_start_cache(settings_for(model_dir), environ,
                                  log=lambda event, **fields: lines.append((event, fields)))
    assert outcome.ping_value == "used"
    assert (Path(environ[TRITON_CACHE_DIR]) / "k1" / "kernel.json").is_file()
    assert (Path(environ[VLLM_CACHE_ROOT]) / "torch_compile_cache" / "graph.py").is_file()
    assert lines[-1][0] == "start_phase" and lines[-1][1]["phase"] == "start_cache"
    assert lines[-1][1]["outcome"] == "used"


def refused(model_dir: Path, cache: Path | None = None, host: HostFacts | None = None,
            **env: str) -> tuple[str, dict[str, str], list[str]]:
    environ: dict[str, str] = {}
    events: list[str] = []
    if cache is not None:
        env = {GATEWAY_START_CACHE: str(cache), **env}
    outcome = prepare_start_cache(settings_for(model_dir, **env), environ, host=host,
                                  log=lambda event, **fields: events.append(event))
    return outcome.ping_value, environ, events


def test_a_tampered_tarball_is_refused(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    packed(model_dir, out)
    with (out / TARBALL_NAME).open("r+b") as handle:
        handle.seek(20)
        handle.write(b"\xff\xff")
    ping, environ, events = refused(model_dir, out)
    assert ping.startswith("refused: start-cache.tar.gz: SHA-256") and environ == {}
    assert events == ["start_cache_refused", "start_phase"]


def test_a_foreign_gpu_and_another_vllm_are_refused(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    packed(model_dir, out)
    here = host_facts()
    ping, environ, _ = refused(model_dir, out, host=replace(here, gpu_name="NVIDIA H100"))
    assert ping.startswith("refused: gpu_name: the cache was built for") and environ == {}
    ping, _, _ = refused(model_dir, out, host=replace(here, vllm_version="0.99.0"))
    assert "vllm_version" in ping and "'0.99.0'" in ping and "(stale)" in ping


def test_other_engine_arguments_are_refused_at_start(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    packed(model_dir, out)
    ping, environ, _ = refused(model_dir, out, ENGINE_MAX_NUM_SEQS="32")
    assert ping.startswith("refused: engine argument max_num_seqs: the cache was built for 128")
    assert environ == {}


def test_a_tarball_with_a_path_out_of_the_cache_is_refused(model_dir: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "cache"
    manifest = packed(model_dir, out)
    tarball = out / TARBALL_NAME
    with tarfile.open(tarball, "w:gz") as archive:
        info = tarfile.TarInfo("triton/../../escaped.txt")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"bad"))
    evil = replace(manifest, tarball_sha256=sha256_file(tarball),
                   tarball_bytes=tarball.stat().st_size)
    (out / MANIFEST_NAME).write_text(evil.to_json(), encoding="utf-8")
    ping, environ, _ = refused(model_dir, out)
    assert "an absolute path or one with '..'" in ping and environ == {}
    assert not (tmp_path / "escaped.txt").exists()


def test_a_cache_the_model_manifest_does_not_name_or_names_otherwise_is_refused(
        model_dir: Path) -> None:
    packed(model_dir, model_dir / "start-cache")
    names = list_artifact_files(model_dir)
    every = describe_files(model_dir, names).files
    base = {path: digest for path, digest in every.items() if not path.startswith("start-cache/")}
    cache = {path: digest for path, digest in every.items() if path.startswith("start-cache/")}
    manifest_path = model_dir / MANIFEST_FILE
    manifest_path.write_text(ArtifactFiles(files=base).to_json(), encoding="utf-8")
    ping, _, _ = refused(model_dir)
    assert "artifact manifest: start-cache/: artifact-manifest.json names no start cache" in ping
    manifest_path.write_text(ArtifactFiles(files=base, start_cache=cache).to_json(),
                             encoding="utf-8")
    assert refused(model_dir)[0] == "used"
    (model_dir / "start-cache" / MANIFEST_NAME).write_text(
        (model_dir / "start-cache" / MANIFEST_NAME).read_text() + " ", encoding="utf-8")
    assert "artifact manifest: start-cache/start-cache.json:" in refused(model_dir)[0]


def test_no_cache_off_and_a_missing_named_directory(model_dir: Path, tmp_path: Path) -> None:
    assert refused(model_dir)[0] == "none"  # no start-cache folder: nothing to do
    packed(model_dir, model_dir / "start-cache")
    assert refused(model_dir, **{GATEWAY_START_CACHE: "off"})[0] == "none"
    ping, _, events = refused(model_dir, tmp_path / "absent")
    assert ping.startswith(f"refused: {GATEWAY_START_CACHE}=") and "not a directory" in ping
    assert events == ["start_cache_refused", "start_phase"]


def test_a_relative_setting_is_an_error_naming_it() -> None:
    with pytest.raises(SettingsError, match=rf"{GATEWAY_START_CACHE}='cache': expected 'off' or "
                                            "an absolute directory path"):
        load_settings({GATEWAY_START_CACHE: "cache"})


# --- a real gateway start on the simulated engine ----------------------------------------------


def phase(gateway: GatewayProcess, name: str) -> dict[str, Any]:
    found = [line for line in gateway.lines()
             if line.get("event") == "start_phase" and line.get("phase") == name]
    assert found, f"no start_phase {name}"
    return found[-1]


def test_the_gateway_builds_uses_and_refuses_the_cache(model_dir: Path, tmp_path: Path) -> None:
    env = {"SIM_FIRST_USE_S": "0.2", "GATEWAY_METRICS_INTERVAL_S": "1"}
    out = model_dir / "start-cache"
    manifest = build(model_dir, out, None, serve=[sys.executable, str(SERVE), "--engine", "sim"],
                     timeout_s=60, base={**os.environ, **env})
    assert manifest.contents == ("vllm",)  # the simulator compiles no Triton kernel
    logs = tmp_path / "logs"
    logs.mkdir()
    used = GatewayProcess(model_dir, logs, env)
    try:
        assert used.wait_ready()["start_cache"] == "used"
        line = phase(used, "start_cache")
        assert line["outcome"] == "used" and VLLM_CACHE_ROOT in line
        assert TRITON_CACHE_DIR not in line
        used_first_use = phase(used, "warmup_first_use")["seconds"]
    finally:
        used.stop()
    stale = GatewayProcess(model_dir, logs, {**env, "ENGINE_MAX_NUM_SEQS": "64"})
    try:
        body = stale.wait_ready()
        assert body["start_cache"].startswith("refused: engine argument max_num_seqs")
        line = phase(stale, "start_cache")
        assert line["outcome"] == "refused" and VLLM_CACHE_ROOT not in line
        assert any(entry.get("event") == "start_cache_refused" for entry in stale.lines())
        # The engine read its compile cache from VLLM_CACHE_ROOT when it was used: the first
        # uses (0.2 s each) are paid again only without it.
        assert phase(stale, "warmup_first_use")["seconds"] >= used_first_use + 0.4
    finally:
        stale.stop()
