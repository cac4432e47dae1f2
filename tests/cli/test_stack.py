"""The stack launcher's pieces that need no processes: settings handed to children, ports.

Starting the whole stack is exercised by ``test_demo.py`` (the demo runs on it) and by
``tests/e2e/test_flower_browser.py``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from sessionfold.cli.stack import StackOptions, free_port, port_or_free, settings_environ
from sessionfold.core.errors import InvalidInputError
from sessionfold.runtime.settings import ENV_PREFIX, Settings

_PLAIN = ("REDIS_URL", "DATABASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def test_a_child_rebuilds_the_same_settings_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = Settings(data_dir=tmp_path / "d", redis_url="redis://:pw@10.0.0.5:6380/3",
                     database_url="postgresql+psycopg://app:pw@db/sessions", key_prefix="t7:",
                     anthropic_api_key="sk-test", summarizer="offline",
                     flower_basic_auth="ops:hunter22", task_time_limit_s=100,
                     task_soft_time_limit_s=80, metrics_port=0, worker_concurrency=3)
    env = settings_environ(given)
    assert env["REDIS_URL"] == "redis://:pw@10.0.0.5:6380/3"
    assert env[ENV_PREFIX + "FLOWER_BASIC_AUTH"] == "ops:hunter22"  # a child needs the secret
    for name in _PLAIN:
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings() == given


def test_unset_fields_stay_unset_in_the_child(tmp_path: Path) -> None:
    env = settings_environ(Settings(data_dir=tmp_path, redis_url=None, database_url=None,
                                    anthropic_api_key=None, summarizer="offline"))
    assert not set(_PLAIN) & set(env)
    assert env[ENV_PREFIX + "SUMMARIZER"] == "offline"
    assert env[ENV_PREFIX + "DATA_DIR"] == str(tmp_path.resolve())


def test_a_busy_port_is_replaced_by_a_free_one() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        other = port_or_free("127.0.0.1", taken)
        assert other != taken
    free = free_port()
    assert port_or_free("127.0.0.1", free) == free


def test_stack_options_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="workers"):
        StackOptions(workers=-1)
    with pytest.raises(InvalidInputError, match="concurrency"):
        StackOptions(worker_concurrency=0)
