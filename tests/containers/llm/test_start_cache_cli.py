"""python -m gateway.start_cache: pack and verify as a command (exit 0 accepted, 1 refused, 2 bad
input); build over a real gateway start is tests/containers/llm/test_start_cache.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.start_cache.cli import main, read_env_file


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return target


def test_pack_then_verify_then_refuse_other_engine_arguments(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    triton = tmp_path / "triton"
    (triton / "abc").mkdir(parents=True)
    (triton / "abc" / "k.cubin").write_bytes(b"\0" * 64)
    out = tmp_path / "out"
    assert main(["pack", "--triton", str(triton), "--model-dir", str(model_dir),
                 "--out", str(out)]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["start-cache.json",
                                                           "start-cache.tar.gz"]
    assert main(["verify", str(out), "--model-dir", str(model_dir)]) == 0
    assert "accepted" in capsys.readouterr().out
    env_file = tmp_path / "engine.env"
    env_file.write_text("# the deployment's engine\nENGINE_MAX_NUM_SEQS=32\n")
    assert main(["verify", str(out), "--model-dir", str(model_dir),
                 "--gateway-env-file", str(env_file)]) == 1
    assert "refused: engine argument max_num_seqs" in capsys.readouterr().out


def test_nothing_to_pack_and_a_bad_env_file_are_errors(model_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["pack", "--triton", str(tmp_path / "empty"), "--model-dir", str(model_dir),
                 "--out", str(tmp_path / "out")]) == 2
    assert "no cache files to pack" in capsys.readouterr().err
    bad = tmp_path / "bad.env"
    bad.write_text("NOT A PAIR\n")
    with pytest.raises(ValueError, match=r"bad\.env:1: expected KEY=VALUE"):
        read_env_file(bad)
    shutil.rmtree(tmp_path / "empty")
