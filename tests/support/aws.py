"""Fake AWS credentials for tests that talk to moto: boto3 finds these before any real ones, so
nothing a test does can reach an AWS account."""

from __future__ import annotations

import pytest

REGION = "ap-northeast-1"
"""The embedded configurations' region (config/*.yaml)."""

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_SESSION_TOKEN": "testing"}
"""moto's documented dummy credentials, also for the environment of a child process."""


def fake_credentials(monkeypatch: pytest.MonkeyPatch, region: str = REGION,
                     **extra: str) -> None:
    """Set the fake credentials, the default region and any ``extra`` variables for one test;
    forget AWS_PROFILE so a developer's profile is never read."""
    for name, value in {**FAKE_CREDENTIALS, "AWS_DEFAULT_REGION": region, **extra}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
