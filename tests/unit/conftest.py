"""Fixtures shared by the pure tests."""
import os

import pytest


@pytest.fixture()
def no_aws(tmp_path, monkeypatch):
    """No credentials, no endpoint, a fresh EC2GPU_HOME, tmp_path the current directory: what a
    dry run or a task file's loading needs, and nothing more; an AWS client made fails the test."""
    for k in list(os.environ):
        if k.startswith(("AWS_", "EC2GPU_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    import boto3

    def refuse(*a, **k):
        raise AssertionError("a dry run made an AWS client")
    monkeypatch.setattr(boto3, "client", refuse)
    monkeypatch.setattr(boto3.session.Session, "client", refuse)
    monkeypatch.chdir(tmp_path)
    return tmp_path
