"""The ``sessionfold`` command loads what a command runs, when it runs (issue 34).

``sessionfold --help`` and every ``sessionfold COMMAND --help`` are counted in a fresh
interpreter (modules in ``sys.modules``, not seconds: a count does not depend on the machine's
load); the values the help spells out are held to their owners; a command whose extra is
missing exits 2 naming the extra, never with a traceback; the store's commands run with every
extra missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest
from sessionfold.cli.commands import compact, prune, store
from sessionfold.cli.main import build_parser
from sessionfold.core.errors import EXTRA_OF_MODULE
from sessionfold.core.policy import LAYERS
from sessionfold.core.summarizers import DEFAULT_MODEL
from sessionfold.runtime.providers import DEFAULT_SUMMARIZER_MODELS
from sessionfold.runtime.settings import Settings, env_name
from sessionfold.store.pruning import MAX_PRUNE_BATCH
from sessionfold.store.search import MAX_REINDEX_BATCH

#: The issue's bound: ``--help`` loads fewer modules than this (it loaded 4,569 before).
MAX_HELP_MODULES = 300
#: What no help may load: the engine and every library under it.
HEAVY = ("sessionfold.core", "sessionfold.store", "sessionfold.runtime", "sessionfold.client",
         "sessionfold.workers", "sessionfold.service", "pydantic", "sqlalchemy", "redis",
         "tiktoken", "anthropic", "celery", "fastapi", "uvicorn", "rich", "matplotlib")

#: Run in a fresh interpreter: every ``argv`` of ``sys.argv[1]`` (a JSON list of argv lists)
#: through ``main`` in turn, recording the exit code, the output and how many modules were
#: loaded by then; the heavy modules loaded at the end.
_HELP_RUNS = """
import contextlib, io, json, sys
from sessionfold.cli.main import main
runs = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    runs.append({"argv": argv, "code": code, "out": out.getvalue(), "modules": len(sys.modules)})
heavy = sorted(m for m in sys.modules if m.startswith(HEAVY))
print(json.dumps({"runs": runs, "heavy": heavy}))
"""

#: Run in a fresh interpreter: make every module an extra brings unimportable, then run
#: ``main(sys.argv[1:])`` and exit with its code.
_WITHOUT_EXTRAS = """
import sys
from sessionfold.core.errors import EXTRA_OF_MODULE
for name in EXTRA_OF_MODULE:
    sys.modules[name] = None  # import raises ModuleNotFoundError, as if not installed
from sessionfold.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _help_runs(argvs: list[list[str]]) -> dict[str, Any]:
    code = _HELP_RUNS.replace("HEAVY", repr(tuple(f"{h}" for h in HEAVY)), 1)
    done = subprocess.run([sys.executable, "-c", code, json.dumps(argvs)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for sub in _subparsers(parser).values():
        found += _every_parser(sub)
    return found


def test_sessionfold_help_loads_under_300_modules_and_no_engine() -> None:
    result = _help_runs([["--help"]])
    (run,) = result["runs"]
    assert run["code"] == 0 and "usage: sessionfold" in run["out"], run["out"]
    assert run["modules"] < MAX_HELP_MODULES, run["modules"]
    assert result["heavy"] == []


def test_every_commands_help_loads_under_300_modules() -> None:
    parser = build_parser()
    commands = sorted(_subparsers(parser))
    assert len(commands) > 15, commands
    argvs = [[name, "--help"] for name in commands]
    argvs += [["keys", action, "--help"] for action in ("create", "list", "revoke")]
    # One interpreter for all of them: what the last one counts, every help loaded together.
    result = _help_runs(argvs)
    for run in result["runs"]:
        usage = "usage: sessionfold " + " ".join(run["argv"][:-1])
        assert run["code"] == 0 and usage in run["out"], run
    assert result["runs"][-1]["modules"] < MAX_HELP_MODULES, result["runs"][-1]["modules"]
    assert result["heavy"] == []


def test_the_count_sees_a_command_that_loads_the_engine() -> None:
    # The checks above can fail: running a command (not its help) loads the engine.
    example = Path(__file__).resolve().parents[2] / "cli" / "examples" / \
        "ops-incident-acct-8842.json"
    result = _help_runs([["--help"], ["compact", str(example), "--report"]])
    helped, ran = result["runs"]
    assert ran["code"] == 0 and "outcome: folded" in ran["out"], ran["out"]
    assert ran["modules"] > helped["modules"] + 100, (helped["modules"], ran["modules"])
    assert {"sessionfold.core", "pydantic", "tiktoken"} <= set(result["heavy"])


def test_the_help_spells_the_values_their_owners_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    # The help writes these out so that it imports no engine or store; here they meet.
    assert ", ".join(LAYERS) == compact.HELP_LAYERS
    owners = {"anthropic": DEFAULT_MODEL, "openai": DEFAULT_SUMMARIZER_MODELS["openai"]}
    assert owners == compact.HELP_MODELS
    assert DEFAULT_SUMMARIZER_MODELS["anthropic"] == DEFAULT_MODEL
    assert prune.HELP_MAX_PRUNE_BATCH == MAX_PRUNE_BATCH
    assert store.HELP_MAX_REINDEX_BATCH == MAX_REINDEX_BATCH
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at the terminal's width otherwise
    helps = {name: sub.format_help() for name, sub in _subparsers(build_parser()).items()}
    flat = {name: " ".join(text.split()) for name, text in helps.items()}
    assert compact.HELP_LAYERS in flat["compact"] and DEFAULT_MODEL in flat["compact"]
    assert f"1 to {MAX_PRUNE_BATCH}" in flat["prune"]
    assert f"1 to {MAX_REINDEX_BATCH}" in flat["reindex"]


def test_every_setting_the_help_names_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no name broken over two lines
    settings = {env_name(field) for field in Settings.model_fields}
    named: set[str] = set()
    for parser in _every_parser(build_parser()):
        named.update(re.findall(r"\bSESSIONFOLD_[A-Z0-9_]*[A-Z0-9](?:_\*)?", parser.format_help()))
    assert {"SESSIONFOLD_PRUNE_BATCH", "SESSIONFOLD_API_HOST", "SESSIONFOLD_API_PORT"} <= named
    # ``SESSIONFOLD_RETAIN_*`` names a family: some setting must start so.
    unknown = {name for name in named if not (
        name in settings or (name.endswith("_*")
                             and any(s.startswith(name[:-1]) for s in settings)))}
    assert unknown == set(), "the help names variables Settings does not read"


def _without_extras(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL") and not k.startswith("SESSIONFOLD_")}
    env["SESSIONFOLD_DATA_DIR"] = str(cwd / "data")
    return subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS, *argv], capture_output=True,
                          text=True, timeout=120, check=False, cwd=cwd, env=env)


@pytest.mark.parametrize(("argv", "message"), [
    (["worker"], "sessionfold worker needs the worker extra: pip install 'sessionfold[worker]'"),
    (["scheduler"], "sessionfold scheduler needs the worker extra"),
    (["flower"], "sessionfold flower needs the worker extra"),
    (["serve"], "sessionfold serve needs the api extra: pip install 'sessionfold[api]'"),
    (["demo"], "sessionfold demo needs the demo extra: pip install 'sessionfold[demo]'"),
    (["list", "--database-url", "postgresql://postgres@127.0.0.1:9/none"],
     "sessionfold list: a PostgreSQL store needs the postgres extra: "
     "pip install 'sessionfold[postgres]'"),
])
def test_a_command_whose_extra_is_missing_names_it_and_exits_2(argv: list[str], message: str,
                                                                tmp_path: Path) -> None:
    done = _without_extras(argv, tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert message in done.stderr, done.stderr
    assert done.returncode == 2, (done.stdout, done.stderr)


def test_the_store_commands_run_with_every_extra_missing(tmp_path: Path) -> None:
    assert {"celery", "fastapi", "uvicorn", "flower", "matplotlib", "psycopg", "rich",
            "openai"} <= set(EXTRA_OF_MODULE)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    for argv in (["migrate", "--database-url", url], ["list", "--database-url", url],
                 ["pause", "nobody"]):
        done = _without_extras(argv, tmp_path)
        expected = 2 if argv[0] == "pause" else 0  # an unknown session: a usage error
        assert done.returncode == expected, (argv, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr


def test_the_stand_in_serves_an_agent_with_every_extra_missing(tmp_path: Path) -> None:
    # `sessionfold standin` is for an agent's developer, who has the base install.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONFOLD_")}
    served = subprocess.Popen([sys.executable, "-c", _WITHOUT_EXTRAS, "standin", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=env)
    try:
        assert served.stdout is not None
        first = served.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)", first)
        assert found, first + (served.stderr.read() if served.stderr else "")
        claude = anthropic.Anthropic(api_key="standin", base_url=found.group(1), max_retries=0)
        reply = claude.messages.create(model="m", max_tokens=32,
                                       messages=[{"role": "user", "content": "hello"}])
        assert reply.content[0].type == "text" and "hello" in reply.content[0].text
    finally:
        served.send_signal(signal.SIGTERM)
        _, err = served.communicate(timeout=60)
    assert served.returncode == 0, err
    assert "Traceback" not in err, err
