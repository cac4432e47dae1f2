"""Flower behind a login by default (issue 33): ``sessionfold up`` never opens Flower's API to
anyone who can reach the port (``FLOWER_UNAUTHENTICATED_API``: any web page the developer
visits could enqueue a fold, and read session ids and lock tokens); it makes a login, prints it
and keeps it in the data dir with mode 0600."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from sessionfold.cli.stack import (
    FLOWER_LOGIN_FILE,
    Stack,
    StackOptions,
    flower_login,
    free_port,
)
from sessionfold.runtime.settings import Settings


def test_a_login_is_made_kept_private_and_given_to_flower(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    updated, login = flower_login(settings)
    path = tmp_path / "data" / FLOWER_LOGIN_FILE
    assert login.path == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text(encoding="utf-8").strip() == f"{login.user}:{login.password}"
    assert len(login.password) >= 24
    assert updated.flower_basic_auth is not None
    assert updated.flower_basic_auth.get_secret_value() == f"{login.user}:{login.password}"
    assert login.password in login.describe() and str(path) in login.describe()
    again = flower_login(settings)[1]
    assert again.password != login.password  # a new one per start
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_operators_own_login_is_used_and_never_written_or_shown(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", flower_basic_auth="ops:hunter22xyz")
    updated, login = flower_login(settings)
    assert updated is settings and (login.user, login.path) == ("ops", None)
    assert "hunter22xyz" not in login.describe()
    assert not (tmp_path / "data" / FLOWER_LOGIN_FILE).exists()


@pytest.fixture
def flower_stack(tmp_path: Path) -> Iterator[Stack]:
    settings = Settings(data_dir=tmp_path / "data", redis_url=None, database_url=None,
                        flower_port=free_port(), metrics_port=0)
    with Stack(settings, StackOptions(workers=0, scheduler=False, metrics=False,
                                      log_dir=tmp_path / "logs")) as stack:
        stack.wait_ready()
        yield stack


def test_flower_of_the_stack_answers_its_api_only_with_the_login(flower_stack: Stack) -> None:
    login = flower_stack.flower_login
    assert login is not None and login.path is not None
    assert login.path.read_text(encoding="utf-8").strip() == f"{login.user}:{login.password}"
    url = f"{flower_stack.flower_url}/api/workers"
    anonymous = httpx2.get(url, timeout=10)
    assert anonymous.status_code == 401
    assert "access-control-allow-origin" not in anonymous.headers
    # A page on another site, or a rebound DNS name, has no login for this origin.
    rebound = httpx2.get(url, timeout=10, headers={"Host": "evil.example:5555",
                                                   "Origin": "http://evil.example"})
    assert rebound.status_code == 401
    posted = httpx2.post(f"{flower_stack.flower_url}/api/task/async-apply/"
                         "sessionfold.fold_session", content=b'{"args": ["s1"]}', timeout=10,
                         headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert posted.status_code in (401, 403)
    assert httpx2.get(url, timeout=10, auth=(login.user, login.password)).status_code == 200
    wrong = httpx2.get(url, timeout=10, auth=(login.user, login.password + "x"))
    assert wrong.status_code == 401
