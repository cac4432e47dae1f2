"""``sessionfold keys`` and ``sessionfold serve`` as an operator runs them (console script in a
subprocess): keys are printed once and stored hashed; a busy port is one line and exit 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from sessionfold.service.auth import key_digest, parse_key
from sessionfold.store import SessionStore

SCRIPT = Path(sys.executable).with_name("sessionfold")


def run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=300,
                          env=env)


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SESSIONFOLD_") and k not in ("DATABASE_URL", "REDIS_URL")}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'store.db'}"
    env["SESSIONFOLD_DATA_DIR"] = str(tmp_path / "data")
    return env


def test_a_key_is_printed_once_stored_as_a_digest_listed_and_revoked(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    made = run("keys", "create", "acme", env=env)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    parsed = parse_key(key)
    assert parsed is not None
    key_id, secret = parsed
    store = SessionStore.from_url(env["DATABASE_URL"])
    try:
        row = store.get_api_key(key_id)
        assert row is not None and row.tenant == "acme" and not row.admin
        assert row.digest == key_digest(key_id, secret) and secret not in row.digest
    finally:
        store.close()
    assert secret not in (tmp_path / "store.db").read_bytes().decode("latin-1")
    listed = run("keys", "list", env=env)
    assert key_id in listed.stdout and secret not in listed.stdout
    assert run("keys", "revoke", key_id, env=env).returncode == 0
    again = run("keys", "revoke", key_id, env=env)
    assert again.returncode == 2 and "no live key" in again.stderr


def test_a_bad_tenant_name_is_one_line_and_exit_2(tmp_path: Path) -> None:
    made = run("keys", "create", "Has/Slash", env=cli_env(tmp_path))
    assert made.returncode == 2 and made.stdout == ""
    assert made.stderr.count("\n") == 1 and "tenant name" in made.stderr


def test_serve_on_a_busy_port_says_so_and_exits_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run("serve", "--port", str(port), env=cli_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert f"port {port} on 127.0.0.1 is in use" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
