"""Run the quantization job's script (containers/quantize/quantize-job) as SageMaker would, on
this machine: the quantization environment's interpreter, and a stand-in ``aws`` that records its
arguments instead of uploading."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_job(
    quant_python: Path, model_dir: Path, tmp_path: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run containers/quantize/quantize-job with the quantization env's python and a fake aws."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A wrapper, not a symlink: a venv's interpreter finds its pyvenv.cfg by the path it is run as.
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {quant_python} "$@"\n')
    wrapper.chmod(0o755)
    aws_log = tmp_path / "aws-calls.txt"
    fake_aws = bin_dir / "aws"
    fake_aws.write_text(f'#!/bin/sh\necho "$@" >> {aws_log}\n')
    fake_aws.chmod(0o755)
    result = subprocess.run(
        [str(REPO_ROOT / "containers/quantize/quantize-job"), "train",
         "--num-samples", "4", "--max-seq-len", "128"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "MODEL_DIR": str(model_dir),
            "QUANTIZED_DIR": str(tmp_path / "quantized"),
            "REPORT_DIR": str(tmp_path / "gate"),
            "FAILURE_FILE": str(tmp_path / "failure"),
            "EVAL_MAX_NEW_TOKENS": "6",
            "ARTIFACT_S3_URI": "s3://artifacts-bucket/quantization/models/job-1/",
            "REPORT_S3_URI": "s3://artifacts-bucket/quantization/runs/job-1/",
            **env,
        },
    )  # fmt: skip
    return result, aws_log
