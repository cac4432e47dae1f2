"""``sessionfold standin``: the stand-in model as a command, the way a newcomer's SDK meets it.

Each served test starts the real command in its own process (``--port 0``), reads the URL from
its first line, talks to it with the real ``anthropic`` and ``openai`` SDKs, then stops it with a
signal and holds it to a clean exit and its closing line. Bad input never gets as far as serving,
so those run in process.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from sessionfold.cli.main import main
from sessionfold.cli.standin.fakeprovider import ToolUse
from sessionfold.cli.standin.script import parse_script
from sessionfold.core.errors import InvalidInputError


@dataclass
class Served:
    url: str
    first_line: str
    #: Filled in when the command has stopped.
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""


@contextmanager
def standin(*args: str, stop: signal.Signals = signal.SIGTERM) -> Iterator[Served]:
    # Unbuffered bytes: readline() takes the first line and not a byte more, so communicate()
    # still gets the rest.
    proc = subprocess.Popen([sys.executable, "-m", "sessionfold.cli", "standin", "--port", "0",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    first = proc.stdout.readline().decode()
    found = re.search(r"http://127\.0\.0\.1:(\d+)", first)
    if found is None:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"no URL on the first line: {first!r}; stderr: {err.decode()[-2000:]}")
    served = Served(found[0], first)
    try:
        yield served
    finally:
        proc.send_signal(stop)
        rest, err = proc.communicate(timeout=60)
        served.stdout, served.stderr = first + rest.decode(), err.decode()
        served.returncode = proc.returncode


def _claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="standin", base_url=url, max_retries=0, timeout=20)


def _gpt(url: str) -> openai.OpenAI:
    return openai.OpenAI(api_key="standin", base_url=url + "/v1", max_retries=0, timeout=20)


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _stopped_cleanly(served: Served, requests: int) -> None:
    assert served.returncode == 0, served.stderr
    assert f"stopped after {requests} request(s)" in served.stderr


# --- serving ---------------------------------------------------------------------------------

@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_it_echoes_on_loopback_for_both_sdks_and_a_signal_ends_it_cleanly(
        stop: signal.Signals) -> None:
    with standin(stop=stop) as served:
        assert "echoes every request" in served.first_line
        claude = _claude(served.url)
        reply = claude.messages.create(model="m", max_tokens=64, messages=_ask("hello there"))
        with claude.messages.stream(model="m", max_tokens=64,
                                    messages=_ask("hello there")) as stream:
            streamed = "".join(stream.text_stream)
        chat = _gpt(served.url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello there"}])
    assert reply.content[0].type == "text"
    assert reply.content[0].text == "Noted (1 messages). Latest: hello there"
    assert reply.usage.input_tokens > 0
    assert streamed == reply.content[0].text
    assert chat.choices[0].message.content == reply.content[0].text
    _stopped_cleanly(served, 3)


def test_a_script_plays_its_replies_in_order_then_says_so_and_echoes(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([
        {"tool_calls": [{"name": "read_log", "input": {"page": 1}}]},
        {"text": "Page 1 is clean.", "tool_calls": [
            {"name": "read_log", "input": {"page": 2}},
            {"name": "grep", "input": {"pattern": "REF-2"}, "id": "call_mine"}]},
        "All reconciled.",
    ]))
    with standin("--script", str(script)) as served:
        assert "plays the 3 replies of replies.json, then echoes" in served.first_line
        claude, gpt = _claude(served.url), _gpt(served.url)
        first = claude.messages.create(model="m", max_tokens=64, messages=_ask("reconcile"))
        second = gpt.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "reconcile"}])
        with claude.messages.stream(model="m", max_tokens=64,
                                    messages=_ask("reconcile")) as stream:
            third = stream.get_final_message()
        fourth = claude.messages.create(model="m", max_tokens=64, messages=_ask("anything else?"))
        fifth = claude.messages.create(model="m", max_tokens=64, messages=_ask("and now?"))

    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use" and (call.name, call.input) == ("read_log", {"page": 1})
    assert call.id.startswith("toolu_")
    message = second.choices[0]
    assert message.finish_reason == "tool_calls"
    assert message.message.content == "Page 1 is clean."
    calls = message.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("read_log", {"page": 2}), ("grep", {"pattern": "REF-2"})]
    assert calls[1].id == "call_mine"
    assert [b.text for b in third.content if b.type == "text"] == ["All reconciled."]
    assert third.stop_reason == "end_turn"
    assert fourth.content[0].type == "text"
    assert fourth.content[0].text.startswith("Noted (1 messages). Latest: anything else?")
    assert fifth.content[0].type == "text" and "and now?" in fifth.content[0].text
    # Said once, when the first request past the script arrived.
    assert served.stderr.count("every reply of replies.json is played; echoing from now on") == 1
    _stopped_cleanly(served, 5)


def test_faults_answer_the_first_requests_in_order_then_service_resumes() -> None:
    with standin("--fault", "overloaded", "--fault", "rate-limited") as served:
        claude = _claude(served.url)
        statuses = []
        for _ in range(2):
            with pytest.raises(anthropic.APIStatusError) as failed:
                claude.messages.create(model="m", max_tokens=64, messages=_ask("hi"))
            statuses.append(failed.value.status_code)
        after = claude.messages.create(model="m", max_tokens=64, messages=_ask("hi"))
    assert statuses == [529, 429]
    assert after.content[0].type == "text"
    assert "the first 2 request(s) answer: overloaded, rate-limited" in served.stdout
    assert served.returncode == 0
    assert "stopped after 3 request(s), 1 answered" in served.stderr


def test_latency_slows_every_call_and_the_context_window_refuses_long_prompts() -> None:
    with standin("--latency", "0.4", "--context-window", "2000") as served:
        claude = _claude(served.url)
        started = time.monotonic()
        claude.messages.create(model="m", max_tokens=64, messages=_ask("short"))
        took = time.monotonic() - started
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens "
                                                           r"> 2000 maximum"):
            claude.messages.create(model="m", max_tokens=64, messages=_ask("word " * 4000))
    assert took >= 0.4
    _stopped_cleanly(served, 2)


def test_a_busy_port_exits_2_with_the_reason() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "sessionfold.cli", "standin", "--port",
                               str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"sessionfold standin: cannot listen on 127.0.0.1 port {port}" in done.stderr
    assert "Traceback" not in done.stderr


# --- bad input, refused before anything listens ------------------------------------------------

@pytest.mark.parametrize(("content", "expected"), [
    ("{not json", "not JSON"),
    ("[]", "a non-empty JSON list of replies"),
    ('{"replies": []}', "a non-empty JSON list of replies"),
    ('[{"txt": "hi"}]', r"reply 0: unknown field\(s\) txt"),
    ('["ok", {}]', "reply 1: a reply needs text, tool_calls or both"),
    ('[""]', "reply 0: text must be a non-empty string"),
    ('[{"tool_calls": []}]', "reply 0.tool_calls: a non-empty list"),
    ('[{"tool_calls": [{"input": {}}]}]', r"reply 0.tool_calls\[0\].name"),
    ('[{"tool_calls": [{"name": "t", "input": [1]}]}]', r"reply 0.tool_calls\[0\].input"),
    ('[{"tool_calls": [{"name": "t", "args": {}}]}]', r"unknown field\(s\) args"),
    ('[7]', "reply 0: a reply is a string or an object"),
])
def test_a_bad_script_exits_2_naming_what_is_wrong(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str) -> None:
    script = tmp_path / "replies.json"
    script.write_text(content)
    assert main(["standin", "--script", str(script), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sessionfold standin: --script replies.json")
    assert re.search(expected, err), err


def test_a_missing_script_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["standin", "--script", str(tmp_path / "absent.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--port", "x"], ["--latency", "-1"],
                                  ["--latency", "nan"], ["--context-window", "0"],
                                  ["--fault", "teapot"]])
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["standin", *argv])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("sessionfold: ")


def test_a_script_reads_as_the_stand_ins_replies() -> None:
    replies = parse_script(["plain text", {"text": "then", "tool_calls": [
        {"name": "read_log", "input": {"page": 2}}, {"name": "ls"}]}])
    assert replies == ["plain text", ["then", ToolUse("read_log", {"page": 2}), ToolUse("ls")]]
    with pytest.raises(InvalidInputError, match="script: reply 0"):
        parse_script([{"text": 3}])
