"""``sessionfold flower`` never serves Flower's API unauthenticated beyond this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sessionfold.cli.stack import Stack, StackOptions, check_flower_exposure
from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.settings import Settings


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SESSIONFOLD_", "ANTHROPIC_")) and k not in (
               "REDIS_URL", "DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env["SESSIONFOLD_DATA_DIR"] = str(tmp_path / "data")
    env.update(extra)
    return env


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "flower.example.com"])
def test_flower_without_auth_on_a_reachable_address_exits_2_and_says_why(
        tmp_path: Path, host: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sessionfold.cli", "flower"],
        env=_env(tmp_path, SESSIONFOLD_FLOWER_HOST=host, SESSIONFOLD_FLOWER_PORT="1"),
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert host in lines[0]
    assert "SESSIONFOLD_FLOWER_BASIC_AUTH" in lines[0] and "SESSIONFOLD_FLOWER_HOST" in lines[0]
    assert not (tmp_path / "data" / "redis").exists(), "refused before anything started"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.53"])
def test_flower_without_auth_on_loopback_is_allowed(host: str) -> None:
    check_flower_exposure(Settings(flower_host=host))


def test_flower_with_basic_auth_may_listen_anywhere() -> None:
    check_flower_exposure(Settings(flower_host="0.0.0.0", flower_basic_auth="ops:s3cret"))


def test_the_stack_refuses_an_exposed_unauthenticated_flower_before_starting(
        tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", flower_host="0.0.0.0", redis_url=None,
                        database_url=None)
    with pytest.raises(InvalidInputError, match="SESSIONFOLD_FLOWER_BASIC_AUTH"):
        Stack(settings, StackOptions(workers=0, scheduler=False, metrics=False)).start()
    assert not (tmp_path / "data").exists()
