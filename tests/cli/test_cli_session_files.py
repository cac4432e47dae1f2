"""The CLI and session files: output in UTF-8 whatever the locale, transcripts in, and load
errors that name the file (``compact`` and ``replay``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from sessionfold.cli.main import main
from sessionfold.cli.replay import replay
from sessionfold.client import Client
from sessionfold.core.errors import InvalidMessageError

CJK = {"messages": [{"role": "user", "content": "修复登录错误 😀"},
                    {"role": "assistant", "content": "好的"}]}


def run_with_stdout(stdout: io.TextIOWrapper, *argv: str,
                    monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "stdout", stdout)
    return main(list(argv))


@pytest.mark.parametrize("flags", [[], ["--report"]])
def test_compact_writes_utf8_to_a_stdout_set_to_another_encoding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str]) -> None:
    path = tmp_path / "会话.json"
    path.write_text(json.dumps(CJK, ensure_ascii=False), encoding="utf-8")
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="cp1252")
    assert run_with_stdout(stdout, "compact", str(path), *flags, monkeypatch=monkeypatch) == 0
    text = raw.getvalue().decode("utf-8")
    if flags:
        assert text.startswith("会话.json: 2 messages")
    else:
        assert json.loads(text)["messages"][0]["content"] == "修复登录错误 😀"


def test_the_console_script_writes_utf8_under_a_cp1252_locale(tmp_path: Path) -> None:
    path = tmp_path / "cjk.json"
    path.write_text(json.dumps(CJK, ensure_ascii=False), encoding="utf-8")
    script = Path(sys.executable).with_name("sessionfold")
    proc = subprocess.run([str(script), "compact", str(path)], capture_output=True,
                          timeout=120, env={**os.environ, "PYTHONIOENCODING": "cp1252"})
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    assert json.loads(proc.stdout.decode("utf-8"))["messages"][1]["content"] == "好的"


def test_compact_reads_a_json_lines_transcript(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("\ufeff" + "".join(json.dumps(m) + "\n" for m in CJK["messages"]),
                    encoding="utf-8")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", out)
        assert main(["compact", str(path)]) == 0
    assert [m["role"] for m in json.loads(out.getvalue())["messages"]] == ["user", "assistant"]


class NoPipeline:
    """A client that fails on any use: the replay must refuse a bad file before using it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the replay used the client ({name}) before loading every file")


def test_replay_refuses_a_bad_file_naming_it_before_creating_any_session(tmp_path: Path) -> None:
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    orphan = tmp_path / "orphan.json"
    orphan.write_text(json.dumps({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "zz", "content": "x"}]}]}))
    with pytest.raises(InvalidMessageError) as info:
        replay(cast(Client, NoPipeline()), [ok, orphan])
    assert str(info.value).startswith(f"{orphan}: message 0: ")
    assert "orphan tool_result" in str(info.value)
