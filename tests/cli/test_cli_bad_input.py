"""Bad input to the ``sessionfold`` command: one clear line on stderr, exit 2, nothing written.

Run as a user runs it (the console script in a subprocess), so what the interpreter prints at
exit (a traceback, an "Exception ignored" about a broken pipe) is seen too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sessionfold.cli.commands import compact as compact_command
from sessionfold.cli.main import main
from sessionfold.core.messages import MAX_NESTING_DEPTH

SCRIPT = Path(sys.executable).with_name("sessionfold")


def sessionfold(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, input=stdin,
                          timeout=300)


def assert_one_line_usage_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, (
        f"not one line: {proc.stderr[:2000]!r}")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in {proc.stderr!r}"


def nested_input(levels: int) -> str:
    """A session file whose one tool call's input nests ``levels`` deep."""
    return ('[{"role": "user", "content": "task"}, {"role": "assistant", "content": '
            '[{"type": "tool_use", "id": "t1", "name": "f", "input": '
            + '{"k": ' * levels + "1" + "}" * levels + "}]}]")


BAD_FILES = {
    "json-nested-100k-deep": ("[" * 100_000 + "]" * 100_000, ["nested"]),
    "tool-input-one-level-over": (nested_input(MAX_NESTING_DEPTH + 1),
                                  ["message 1", "content[0].input", f"{MAX_NESTING_DEPTH} levels"]),
    "a-5001-digit-number": ('[{"role": "user", "content": "x"}, {"role": "assistant", "content": '
                            '[{"type": "tool_use", "id": "t", "name": "f", "input": {"n": 1'
                            + "0" * 5000 + "}}]}]", ["digits"]),
    "lone-surrogate-in-text": ('[{"role": "user", "content": "half \\ud800 a pair"}]',
                               ["message 0", "surrogate"]),
    "lone-surrogate-in-system": ('{"system": "be \\udfff kind", "messages": '
                                 '[{"role": "user", "content": "x"}]}', ["system", "surrogate"]),
    "duplicate-tool-use-ids": ('[{"role": "assistant", "content": ['
                               '{"type": "tool_use", "id": "t1", "name": "a", "input": {}}, '
                               '{"type": "tool_use", "id": "t1", "name": "b", "input": {}}]}]',
                               ["message 0", "content[1].id", "'t1'"]),
    "empty-text-block": ('[{"role": "user", "content": [{"type": "text", "text": ""}]}]',
                         ["message 0", "empty"]),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_compact_refuses_a_bad_file_in_one_line(tmp_path: Path, name: str) -> None:
    text, needles = BAD_FILES[name]
    path = tmp_path / f"{name}.json"
    path.write_text(text, encoding="utf-8")
    assert_one_line_usage_error(sessionfold("compact", str(path)), *needles)


def test_compact_refuses_a_bad_file_on_standard_input_in_one_line() -> None:
    text, needles = BAD_FILES["json-nested-100k-deep"]
    assert_one_line_usage_error(sessionfold("compact", "-", stdin=text), "<stdin>", *needles)


def test_compact_refuses_a_budget_no_database_column_holds(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('[{"role": "user", "content": "x"}]', encoding="utf-8")
    proc = sessionfold("compact", str(path), "--budget", str(10**30))
    assert_one_line_usage_error(proc, "budget_tokens", "2,147,483,647")


@pytest.mark.parametrize("level", ["bogus", "5x"])
def test_an_unknown_log_level_is_a_usage_error(tmp_path: Path, level: str) -> None:
    path = tmp_path / "s.json"
    path.write_text('[{"role": "user", "content": "x"}]', encoding="utf-8")
    proc = sessionfold("--log-level", level, "compact", str(path))
    assert_one_line_usage_error(proc, "--log-level", level, "DEBUG", "WARNING")


def test_a_known_log_level_in_any_case_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('[{"role": "user", "content": "x"}]', encoding="utf-8")
    proc = sessionfold("--log-level", "debug", "compact", str(path), "--report")
    assert proc.returncode == 0, proc.stderr
    assert "s.json: 1 messages" in proc.stdout


def test_compact_into_a_reader_that_stops_early_exits_quietly(tmp_path: Path) -> None:
    # Far more output than a pipe buffers, so the write meets the closed pipe.
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"message {i}: " + "words " * 2000} for i in range(60)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(messages), encoding="utf-8")
    proc = subprocess.Popen([str(SCRIPT), "compact", str(path), "--budget", "10000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    head = proc.stdout.read(100)  # what `| head -c 100` reads, then it goes away
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=300)
    assert head.startswith(b'{"system"')
    assert err == ""
    assert code == 141  # 128 + SIGPIPE: what a shell reports for any tool a closed pipe stops


def test_a_broken_pipe_elsewhere_than_stdout_is_not_swallowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(args: object) -> int:
        raise BrokenPipeError("a socket's peer went away")

    monkeypatch.setattr(compact_command, "run", handler)
    with pytest.raises(BrokenPipeError, match="socket"):
        main(["compact", "session.json"])
